"""Regenerate minitrain/rpc/_gen/ from proto/minitrain.proto.

Usage: python scripts/gen_proto.py [--check]

The generated modules are committed so that a runtime install needs no grpcio-tools. `--check`
regenerates into a temporary directory and exits 1 when the committed files differ (the test suite
runs it, so a proto edit without regeneration fails CI).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO = ROOT / "proto" / "minitrain.proto"
OUT = ROOT / "minitrain" / "rpc" / "_gen"
GENERATED = ("minitrain_pb2.py", "minitrain_pb2.pyi", "minitrain_pb2_grpc.py")


def generate(out_dir: pathlib.Path) -> None:
    """Run protoc into out_dir and make the grpc module import its sibling by package path."""
    from grpc_tools import protoc  # dev dependency only

    import grpc_tools

    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO.parent}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        str(PROTO),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    grpc_module = out_dir / "minitrain_pb2_grpc.py"
    text = grpc_module.read_text()
    text = text.replace("import minitrain_pb2 as minitrain__pb2",
                        "from minitrain.rpc._gen import minitrain_pb2 as minitrain__pb2")
    grpc_module.write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed code is stale")
    options = parser.parse_args()
    if not options.check:
        OUT.mkdir(parents=True, exist_ok=True)
        generate(OUT)
        (OUT / "__init__.py").write_text('"""Generated protobuf/gRPC code; do not edit."""\n')
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = pathlib.Path(tmp)
        generate(fresh)
        stale = [name for name in GENERATED
                 if not (OUT / name).exists() or (OUT / name).read_text() != (fresh / name).read_text()]
    if stale:
        print(f"stale generated code: {', '.join(stale)}; run `python scripts/gen_proto.py`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
