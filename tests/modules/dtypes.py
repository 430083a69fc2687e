"""The dtypes the test library has an ``inc_<dtype>`` (x + 1; ``not x`` for bool)
for: read by build_modules.py (TVM's side) and by the tests (through helpers.py),
which import nothing of each other."""

TVM_DTYPES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64",
]
