"""The .proto files are documented, the committed stubs match them, the declared grpcio/protobuf
floors satisfy the generated code's version checks, and the SDK imports without torch or ray."""

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = ROOT / "protos" / "specray" / "v1"
PROTOS = sorted(PROTO_DIR.glob("*.proto"))
FIELD = re.compile(r"^\s*(optional |repeated )?([\w.]+) (\w+) = (\d+);")
MAP = re.compile(r"^\s*map<(\w+), ?(\w+)> (\w+) = (\d+);")  # a repeated entry message with key and value
SCALARS = {1: "double", 2: "float", 3: "int64", 4: "uint64", 5: "int32", 6: "fixed64", 7: "fixed32", 8: "bool",
           9: "string", 12: "bytes", 13: "uint32", 15: "sfixed32", 16: "sfixed64", 17: "sint32", 18: "sint64"}
DOCUMENTED = re.compile(r"^\s*(service|rpc|message|enum|oneof)\b|^\s*[A-Z][A-Z0-9_]* = \d+;")


def declarations(path: Path):
    """(message, field, number, type, repeated) of every field, following message/oneof nesting."""
    scopes: list[str] = []
    for line in path.read_text().splitlines():
        code = line.split("//")[0]
        if m := re.match(r"^\s*(message|oneof|enum|service) (\w+)", code):
            scopes.append(m.group(1) + " " + m.group(2))
        elif (m := FIELD.match(code)) and scopes and scopes[-1].startswith(("message", "oneof")):
            message = [s.split()[1] for s in scopes if s.startswith("message")]
            kind = m.group(2).split(".")[-1]
            yield ".".join(message), m.group(3), int(m.group(4)), kind, m.group(1) == "repeated "
        elif (m := MAP.match(code)) and scopes:
            message = ".".join(s.split()[1] for s in scopes if s.startswith("message"))
            entry = "".join(w.capitalize() for w in m.group(3).split("_")) + "Entry"
            yield message, m.group(3), int(m.group(4)), entry, True
            yield f"{message}.{entry}", "key", 1, m.group(1), False
            yield f"{message}.{entry}", "value", 2, m.group(2), False
        if code.strip().endswith("}") and scopes:
            scopes.pop()


def type_name(field) -> str:
    if field.message_type is not None:
        return field.message_type.name
    if field.enum_type is not None:
        return field.enum_type.name
    return SCALARS[field.type]


def is_repeated(field) -> bool:
    # protobuf 7 dropped `label`; older releases may lack `is_repeated`
    return field.is_repeated if hasattr(field, "is_repeated") else field.label == 3


def version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


@pytest.mark.parametrize("path", PROTOS, ids=lambda p: p.name)
def test_every_rpc_message_and_field_is_commented(path):
    lines = path.read_text().splitlines()
    bare = []
    for i, line in enumerate(lines):
        if DOCUMENTED.match(line) or FIELD.match(line.split("//")[0]) or MAP.match(line.split("//")[0]):
            before = next((x for x in reversed(lines[:i]) if x.strip()), "")
            if not before.strip().startswith("//"):
                bare.append(f"{path.name}:{i + 1}: {line.strip()}")
    assert bare == []


@pytest.mark.parametrize("path", PROTOS, ids=lambda p: p.name)
def test_committed_stubs_match_the_proto(path):
    module = importlib.import_module(f"specray.protos.specray.v1.{path.stem}_pb2")
    assert module.DESCRIPTOR.name == f"specray/v1/{path.name}" and module.DESCRIPTOR.package == "specray.v1"
    declared = set(declarations(path))
    generated = set()

    def walk(messages, prefix=""):
        for msg in messages:
            generated.update((prefix + msg.name, f.name, f.number, type_name(f), is_repeated(f)) for f in msg.fields)
            walk(msg.nested_types, prefix + msg.name + ".")

    walk(module.DESCRIPTOR.message_types_by_name.values())
    assert declared == generated, "stale stubs: run scripts/gen_protos.sh"
    rpcs = set(re.findall(r"^\s*rpc (\w+)\(", path.read_text(), re.M))
    assert rpcs == {m.name for s in module.DESCRIPTOR.services_by_name.values() for m in s.methods}
    importlib.import_module(f"specray.protos.specray.v1.{path.stem}_pb2_grpc")
    assert (PROTO_DIR / f"{path.stem}_pb2.pyi").exists()


def test_declared_floors_satisfy_the_generated_code():
    gencode = set()
    grpc_generated = set()
    for path in PROTO_DIR.glob("*_pb2.py"):
        m = re.search(r"Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),", path.read_text())
        gencode.add(tuple(int(x) for x in m.groups()))
    for path in PROTO_DIR.glob("*_pb2_grpc.py"):
        grpc_generated.add(version(re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'", path.read_text()).group(1)))
    assert len(gencode) == 1 and len(grpc_generated) == 1, "stubs from several protoc versions: regenerate all"
    script = (ROOT / "scripts" / "gen_protos.sh").read_text()
    assert version(re.search(r"TOOLS_VERSION=([\d.]+)", script).group(1)) == grpc_generated.pop()
    pin = version(re.search(r"TOOLS_VERSION=([\d.]+)", script).group(1))
    for pyproject in (ROOT / "pyproject.toml", ROOT / "protos" / "pyproject.toml"):
        deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
        floors = {re.match(r"([\w-]+)>=([\d.]+)", d).group(1): version(re.match(r"[\w-]+>=([\d.]+)", d).group(1))
                  for d in deps if re.match(r"(grpcio|protobuf)>=", d)}
        assert floors["protobuf"] >= next(iter(gencode)), pyproject
        assert floors["grpcio"] >= pin, pyproject


def test_sdk_imports_without_torch_or_ray():
    code = ("import sys, specray.client, specray.protos.specray.v1.generate_pb2_grpc; "
            "print(sorted(m for m in ('torch', 'ray', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_messages_pickle_under_their_import_path():
    """Ray Serve pickles requests to its replicas: classes must name their real module."""
    import pickle

    from specray.protos.specray.v1 import drafter_pb2, generate_pb2

    for module in (generate_pb2, drafter_pb2):
        for name in module.DESCRIPTOR.message_types_by_name:
            assert getattr(module, name).__module__ == module.__name__
    request = generate_pb2.GenerateRequest(text="w5", sampling=generate_pb2.SamplingParams(temperature=0.7))
    assert pickle.loads(pickle.dumps(request)) == request
