"""Print the wire shape of a set of apache.rocketmq.v2 descriptors as JSON: every message's
fields (number, type, label, type name), every enum's values and every method's types.
Run in the official client's interpreter (``rocketmq.grpc_protocol``) and in ours
(``rmqstore.rocketmq_v2``); the two must print the same thing."""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any


def _repeated(field: Any) -> bool:
    # protobuf 7 drops ``label``; 6 has both.
    repeated = getattr(field, "is_repeated", None)
    return bool(repeated) if repeated is not None else field.label == 3


def summary(file_descriptors: list[Any]) -> dict[str, Any]:
    shape: dict[str, Any] = {}

    def message(descriptor: Any) -> None:
        shape[descriptor.full_name] = sorted(
            [f.number, f.name, f.type, _repeated(f), f.message_type.full_name if f.message_type else
             (f.enum_type.full_name if f.enum_type else ""), f.containing_oneof.name if f.containing_oneof else ""]
            for f in descriptor.fields
        )
        for nested in descriptor.nested_types:
            message(nested)
        for enum in descriptor.enum_types:
            shape[enum.full_name] = sorted([v.number, v.name] for v in enum.values)

    for file in file_descriptors:
        for descriptor in file.message_types_by_name.values():
            message(descriptor)
        for enum in file.enum_types_by_name.values():
            shape[enum.full_name] = sorted([v.number, v.name] for v in enum.values)
        for service in file.services_by_name.values():
            shape[service.full_name] = sorted(
                [m.name, m.input_type.full_name, m.output_type.full_name] for m in service.methods
            )
    return shape


def main() -> None:
    package = sys.argv[1]
    files = [importlib.import_module(f"{package}.{name}_pb2").DESCRIPTOR for name in ("definition", "service")]
    print(json.dumps(summary(files), sort_keys=True))


if __name__ == "__main__":
    main()
