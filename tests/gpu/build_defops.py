"""python build_defops.py OUT.so: tests/gpu/defop_ops.py built by build_ops for CUDA
(sm_90 code with an llvm host), with its manifest beside it, on a machine with or
without a GPU: the kernels are compiled here by the pinned nvcc (build_models'
enable_cuda), so the library carries GPU code and loads without TVM's Python."""
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "modules"))

import build_models  # noqa: E402  (tests/modules: enable_cuda, the CUDA target)

from tf_op_tvm import build_ops  # noqa: E402


def main() -> int:
    out = Path(sys.argv[1])
    with tempfile.TemporaryDirectory() as stub_dir:  # a stub driver, if needed, stays out of build/gpu
        build_models.enable_cuda(Path(stub_dir))
    target = {"kind": "cuda", "arch": f"sm_{build_models.CUDA_ARCH}", "host": "llvm"}
    manifest = build_ops.build_ops(HERE / "defop_ops.py", out, target)
    count = sum(len(op["variants"]) for op in manifest["ops"].values())
    print(f"wrote {out}: {count} variants for {manifest['device']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
