"""Ask a running broker (Mink or Kafka) which APIs and versions it advertises.

    python examples/api_versions.py 127.0.0.1:9092

Prints one line per API key (key, name, min-max), then the supported and finalized
features of an ApiVersions v3+ answer.
"""

from __future__ import annotations

import sys

from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from mink.client import BlockingKafkaClient
from mink.protocol.messages import build

API_VERSIONS = 18


def main(address: str) -> None:
    with BlockingKafkaClient(address, timeout=10) as client:
        version = min(client.exchange.ranges[API_VERSIONS][1], 4)
        schema = load_request_schema(API_VERSIONS, version)
        answer = client.call(API_VERSIONS, version, build(
            schema, client_software_name="mink-api-versions", client_software_version="1"))
    if answer.error_code != ErrorCode.none:
        raise SystemExit(f"ApiVersions v{version} refused: {answer.error_code!r}")
    names = _names()
    for entry in sorted(answer.api_keys, key=lambda e: e.api_key):
        print(f"{entry.api_key:>3} {names.get(entry.api_key, '?'):<30} "
              f"{entry.min_version}-{entry.max_version}")
    for feature in getattr(answer, "supported_features", ()):
        print(f"supported feature {feature.name} {feature.min_version}-{feature.max_version}")
    print(f"finalized features epoch {getattr(answer, 'finalized_features_epoch', None)}")
    for feature in getattr(answer, "finalized_features", ()):
        print(f"finalized feature {feature.name} {feature.min_version_level}-"
              f"{feature.max_version_level}")


def _names() -> dict[int, str]:
    import importlib
    import os

    import kio.schema

    names = {}
    root = os.path.dirname(kio.schema.__file__)
    for package in os.listdir(root):
        versions = sorted(v for v in os.listdir(os.path.join(root, package))
                          if v.startswith("v")) if os.path.isdir(
                              os.path.join(root, package)) else []
        if not versions:
            continue
        try:
            module = importlib.import_module(f"kio.schema.{package}.{versions[0]}.request")
        except ImportError:
            continue
        for value in vars(module).values():
            key = getattr(value, "__api_key__", None)
            if isinstance(key, int):
                names[key] = "".join(part.title() for part in package.split("_"))
                break
    return names


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:9092")
