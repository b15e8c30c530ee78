"""The pure parts of security: listener parsing (Kafka's listeners rules), the principal
mapping rules (Kafka's SslPrincipalMapper examples), SCRAM (RFC 7677's test vector), and the
SCRAM credential APIs' refusals over a real node."""

from __future__ import annotations

import base64

import pytest
import trio
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from mink.broker.config import ConfigError, load_config
from mink.protocol import scram
from mink.broker.security.listeners import (
    ListenerError,
    SecurityProtocol,
    parse_listeners,
    parse_protocol_map,
)
from mink.broker.security.ssl_principal import NoMatchingRule, PrincipalMapper, subject_dn
from mink.protocol.apis import ApiKey
from mink.protocol.messages import build
from tests.support.security import raw_client

DEFAULT_MAP = parse_protocol_map(
    "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL")


@pytest.mark.parametrize("value, expected", [
    ("PLAINTEXT://127.0.0.1:9092", [("PLAINTEXT", SecurityProtocol.PLAINTEXT, "127.0.0.1", 9092)]),
    ("SASL_SSL://:9093,SSL://[::1]:9094", [("SASL_SSL", SecurityProtocol.SASL_SSL, "", 9093),
                                           ("SSL", SecurityProtocol.SSL, "::1", 9094)]),
])
def test_listeners_parse(value, expected):
    assert [(x.name, x.protocol, x.host, x.port)
            for x in parse_listeners(value, DEFAULT_MAP)] == expected


def test_listener_names_map_to_protocols():
    protocols = parse_protocol_map("INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL")
    parsed = parse_listeners("INTERNAL://10.0.0.1:9092,EXTERNAL://0.0.0.0:9093", protocols)
    assert [x.protocol for x in parsed] == [SecurityProtocol.PLAINTEXT, SecurityProtocol.SASL_SSL]


@pytest.mark.parametrize("value", ["EXTERNAL://h:1", "PLAINTEXT://h:1,PLAINTEXT://h:2",
                                   "PLAINTEXT:/h:1", "", "PLAINTEXT://h:99999"])
def test_bad_listeners_are_refused(value):
    with pytest.raises(ListenerError):
        parse_listeners(value, DEFAULT_MAP)


def test_config_checks_listeners():
    env: dict = {}
    with pytest.raises(ConfigError, match="not one of the listeners"):
        load_config(env=env, overrides={"listeners": "PLAINTEXT://h:1",
                                        "advertised_listeners": "SSL://h:2"})
    with pytest.raises(ConfigError, match="cannot connect to"):
        load_config(env=env, overrides={"listeners": "PLAINTEXT://:1",
                                        "advertised_listeners": "PLAINTEXT://0.0.0.0:1"})
    with pytest.raises(ConfigError, match="ssl_cert_file"):
        load_config(env=env, overrides={"listeners": "PLAINTEXT://h:1,SSL://h:2"})
    with pytest.raises(ConfigError, match="inter-broker listener"):
        load_config(env=env, overrides={"listeners": "SASL_PLAINTEXT://h:1"})
    with pytest.raises(ConfigError, match="not supported"):
        load_config(env=env, overrides={"sasl_enabled_mechanisms": "GSSAPI"})
    config = load_config(env=env, overrides={
        "listeners": "SASL_PLAINTEXT://h:1,INTERNAL://h:2",
        "listener_security_protocol_map": "INTERNAL:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "inter_broker_listener_name": "internal"})
    assert config.inter_broker_listener() == "INTERNAL"
    # the default stays one open PLAINTEXT listener, as `mink dev` has always had
    bound, advertised = load_config(env=env).kafka_listeners()
    assert [(b.name, b.protocol, b.host, b.port) for b in bound] == [
        ("PLAINTEXT", SecurityProtocol.PLAINTEXT, "127.0.0.1", 9092)]



def test_config_admin_listener_scheme():
    env: dict = {}
    with pytest.raises(ConfigError, match="https:// admin_listener needs ssl_cert_file"):
        load_config(env=env, overrides={"admin_listener": "https://0.0.0.0:9644"})
    with pytest.raises(ConfigError, match="http://HOST:PORT or https://HOST:PORT"):
        load_config(env=env, overrides={"admin_listener": "ftp://0.0.0.0:9644"})
    for value, scheme in (("127.0.0.1:9644", "http"), ("http://127.0.0.1:9644", "http"),
                          ("HTTPS://127.0.0.1:9644", "https")):
        config = load_config(env=env, overrides={"admin_listener": value,
                                                 "ssl_cert_file": "c", "ssl_key_file": "k"})
        assert (config.admin_scheme(), config.admin_address()) == (scheme,
                                                                    ("127.0.0.1", 9644))
    assert load_config(env=env).admin_scheme() is None


# Kafka's SslPrincipalMapper documentation and tests
RULES = ("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,"
         "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,"
         "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L,"
         "DEFAULT")


@pytest.mark.parametrize("dn, name", [
    ("CN=Duke,OU=ServiceUsers,O=Org,C=US", "Duke"),
    ("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US", "duke@sme"),
    ("cn=duke,ou=JavaSoft,o=Sun Microsystems", "duke"),
    ("OU=JavaSoft,O=Sun Microsystems,C=US", "OU=JavaSoft,O=Sun Microsystems,C=US"),
])
def test_principal_mapping_rules(dn, name):
    assert PrincipalMapper(RULES).name(dn) == name


def test_principal_mapping_without_default_may_match_nothing():
    mapper = PrincipalMapper("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/U")
    assert mapper.name("CN=duke,OU=ServiceUsers,O=Org") == "DUKE"
    with pytest.raises(NoMatchingRule):
        mapper.name("CN=duke,OU=Other")
    with pytest.raises(ValueError):
        PrincipalMapper("RULE:broken")


def test_subject_dn_is_rfc2253_most_specific_first():
    subject = ((("countryName", "US"),), (("organizationName", "Acme, Inc"),),
               (("commonName", "bob"), ("userId", "7")))
    assert subject_dn(subject) == r"CN=bob+UID=7,O=Acme\, Inc,C=US"


def test_scram_sha_256_rfc7677_vector():
    m = scram.SCRAM_SHA_256
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    credential = scram.credential_from_salted(
        m, scram.salted_password(m, b"pencil", salt, 4096), salt, 4096)
    server = scram.ScramServer(m)
    assert server.parse_client_first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO") == "user"
    first = server.server_first(credential).decode()
    nonce = first.split(",")[0][2:]
    assert nonce.startswith("rOprNGfwEbeRWgbNEkqO") and ",s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096" in first
    # the RFC's server nonce, so that its client proof applies
    server._nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    server._server_first = f"r={server._nonce},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    final = server.client_final(
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_scram_refuses_a_wrong_proof_and_channel_binding():
    m = scram.SCRAM_SHA_512
    credential = scram.new_credential(m, "right")
    server = scram.ScramServer(m)
    server.parse_client_first(b"n,,n=u,r=abc")
    nonce = server.server_first(credential).decode().split(",")[0][2:]
    with pytest.raises(scram.ScramError):
        server.client_final(f"c=biws,r={nonce},p={base64.b64encode(bytes(64)).decode()}".encode())
    with pytest.raises(scram.ScramError):
        scram.ScramServer(m).parse_client_first(b"p=tls-unique,,n=u,r=abc")
    with pytest.raises(scram.ScramError):
        scram.ScramServer(m).parse_client_first(b"n,a=other,n=u,r=abc")
    assert scram.ScramServer(m).parse_client_first(b"n,,n=a=2Cb=3D,r=x") == "a,b="


async def test_alter_user_scram_credentials_refusals(node):
    schema = load_request_schema(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0)
    from kio.schema.alter_user_scram_credentials.v0.request import (
        ScramCredentialDeletion,
        ScramCredentialUpsertion,
    )

    def up(name, mechanism=2, iterations=4096, salt=b"s" * 16, salted=b"p" * 64):
        return ScramCredentialUpsertion(name=name, mechanism=mechanism, iterations=iterations,
                                        salt=salt, salted_password=salted)

    async with raw_client(node) as client:
        response = await client.call(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, build(
            schema, deletions=(ScramCredentialDeletion(name="ghost", mechanism=1),),
            upsertions=(up("few", iterations=100), up("many", iterations=20000),
                        up("mech", mechanism=7), up("twice"), up("twice"), up(""),
                        up("fine"))))
        results = {r.user: r.error_code for r in response.results}
        assert results == {
            "ghost": ErrorCode.resource_not_found, "few": ErrorCode.unacceptable_credential,
            "many": ErrorCode.unacceptable_credential,
            "mech": ErrorCode.unsupported_sasl_mechanism,
            "twice": ErrorCode.duplicate_resource, "": ErrorCode.unacceptable_credential,
            "fine": ErrorCode.none}
        described = await client.call(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, build(
            load_request_schema(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0), users=None))
        assert [(r.user, [(i.mechanism, i.iterations) for i in r.credential_infos])
                for r in described.results] == [("fine", [(2, 4096)])]
        from kio.schema.describe_user_scram_credentials.v0.request import UserName

        described = await client.call(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, build(
            load_request_schema(ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS, 0),
            users=(UserName(name="nobody"),)))
        assert described.results[0].error_code == ErrorCode.resource_not_found
        response = await client.call(ApiKey.ALTER_USER_SCRAM_CREDENTIALS, 0, build(
            schema, deletions=(ScramCredentialDeletion(name="fine", mechanism=2),),
            upsertions=()))
        assert response.results[0].error_code == ErrorCode.none


async def test_the_security_benchmark_runs(tmp_path):
    """benchmarks/security.py's code path (a half-second round per listener, no figures)."""
    from benchmarks.security import measure, summary

    runs = await measure(1, 0.5)
    assert all(r[0]["messages"] > 0 for r in runs.values())
    assert set(summary(runs)) == {"PLAINTEXT", "SASL_SSL", "sasl_ssl_vs_plaintext_pct"}
