"""The principal of a client certificate: its subject DN (RFC 2253, as Java's
`X500Principal.getName()`), mapped by `ssl.principal.mapping.rules` (Kafka's
SslPrincipalMapper). Pure: no I/O.

Rules are a comma- or newline-separated list of `DEFAULT` (the DN as it is) and
`RULE:pattern/replacement/[L|U]` (the first whose regular expression matches the whole DN
gives the name, `$1` … its groups, L or U the case). A DN no rule matches has no principal:
the connection is refused, as in Kafka.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Attribute names as Java's RFC 2253 output spells them; others keep Python's long name.
_SHORT = {
    "commonName": "CN", "countryName": "C", "localityName": "L",
    "stateOrProvinceName": "ST", "organizationName": "O", "organizationalUnitName": "OU",
    "streetAddress": "STREET", "domainComponent": "DC", "userId": "UID",
}


def _escape(value: str) -> str:
    out = []
    for i, ch in enumerate(value):
        if ch in ',+"\\<>;' or (ch == "#" and i == 0) or (ch == " " and i in (0, len(value) - 1)):
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def subject_dn(subject) -> str:
    """RFC 2253 string of `ssl.SSLObject.getpeercert()["subject"]` (a sequence of RDNs, each
    a sequence of (name, value)): the last RDN first, as Java prints it."""
    rdns = []
    for rdn in reversed(tuple(subject)):
        rdns.append("+".join(f"{_SHORT.get(name, name)}={_escape(value)}"
                             for name, value in rdn))
    return ",".join(rdns)


class NoMatchingRule(Exception):
    pass


@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern | None  # None: DEFAULT
    replacement: str = ""
    case: str = ""

    def apply(self, dn: str) -> str | None:
        if self.pattern is None:
            return dn
        match = self.pattern.fullmatch(dn)
        if match is None:
            return None
        name = match.expand(self.replacement)
        return name.lower() if self.case == "L" else name.upper() if self.case == "U" else name


# Kafka's RULE_SPLITTER: a rule's pattern and replacement may hold commas and escaped slashes.
_RULE = re.compile(r"\s*(DEFAULT|RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?).*?)\s*"
                   r"(?:[,\n]\s*|$)")


def _java_replacement(text: str) -> str:
    """A Java replacement ($1, \\$) as a Python template (\\g<1>)."""
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            out.append("\\\\" if nxt == "\\" else nxt)
            i += 2
        elif ch == "$" and i + 1 < len(text) and text[i + 1].isdigit():
            j = i + 1
            while j < len(text) and text[j].isdigit():
                j += 1
            out.append(f"\\g<{text[i + 1:j]}>")
            i = j
        else:
            out.append(ch)
            i += 1
    return "".join(out)


class PrincipalMapper:
    def __init__(self, rules: str = "DEFAULT") -> None:
        self.rules = self._parse(rules)

    @staticmethod
    def _parse(rules: str) -> list[_Rule]:
        text = rules.strip()
        if not text:
            return [_Rule(None)]
        out, pos = [], 0
        while pos < len(text):
            match = _RULE.match(text, pos)
            if match is None or match.end() == pos:
                raise ValueError(f"ssl_principal_mapping_rules: cannot parse {text[pos:]!r}")
            if match[1] == "DEFAULT":
                out.append(_Rule(None))
            else:
                pattern = match[2].replace("\\/", "/")
                try:
                    compiled = re.compile(pattern)
                except re.error as exc:
                    raise ValueError(f"ssl_principal_mapping_rules: bad pattern "
                                     f"{pattern!r}: {exc}") from None
                out.append(_Rule(compiled, _java_replacement(match[3].replace("\\/", "/")),
                                 match[4]))
            pos = match.end()
        return out

    def name(self, dn: str) -> str:
        for rule in self.rules:
            name = rule.apply(dn)
            if name is not None:
                return name
        raise NoMatchingRule(f"no ssl.principal.mapping.rules rule matches {dn!r}")


__all__ = ["NoMatchingRule", "PrincipalMapper", "subject_dn"]
