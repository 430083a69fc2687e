"""TF -> TFLite: a traced function frozen into the flatbuffer TVM's frontend
reads, and the fingerprint of everything that conversion reads, which keys the
cache without converting (the conversion takes seconds: 4-18 s for ResNet50)."""

from __future__ import annotations

import functools
import hashlib
import logging
import re
from pathlib import Path
from typing import Any, NamedTuple

import tensorflow as tf

from tf_op.compiler.errors import CompileError


def to_tflite(concrete: Any, name: str) -> bytes:
    """The concrete function as a float TFLite flatbuffer, weights frozen.

    No trackable object goes to the converter on purpose: with one it keeps
    variables as resource variables (VAR_HANDLE / READ_VARIABLE, which TVM's
    frontend rejects); without, it freezes them into constants. No
    optimizations: weights stay float32, so TVM matches TF to rounding.

    What this reads is what ``fingerprint`` hashes: a change here is a change of
    this file's source, which the fingerprint holds."""
    absl_logger = logging.getLogger("absl")
    absl_logger.addFilter(_without_trackable_warning)
    try:
        converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete])
    finally:
        absl_logger.removeFilter(_without_trackable_warning)
    converter.optimizations = []
    try:
        return converter.convert()
    except Exception as err:  # noqa: BLE001  (the converter raises several types; all mean "cannot")
        raise CompileError(f"tf_op.compile({name}): {_rejection(str(err))}") from err


def _rejection(message: str) -> str:
    """The converter's error, first the TF ops it has no TFLite builtin for
    (TVM compiles from TFLite's op set), then its MLIR dump."""
    listed = re.findall(r"^(?:TF Select|Custom) ops: ([^\n]+)", message, re.MULTILINE)
    names = sorted({o.strip() for line in listed for o in line.split(",") if o.strip()}
                   | set(re.findall(r"'tf\.(\w+)' op is neither a custom op nor a flex op", message)))
    if not names:
        return f"TF's TFLite converter rejected the function: {message}"
    return (f"the function uses TF ops TVM cannot compile: {', '.join(names)} (TFLite, the op set TVM compiles "
            f"from, has no builtin for them). Compute them outside the function, or let tf_op.auto.enable() "
            f"compile the rest and leave them to TF. The converter's error follows:\n{message}")


def _without_trackable_warning(record: logging.LogRecord) -> bool:
    """Drops the converter's deprecation warning of the path to_tflite takes on
    purpose (no trackable object): it speaks of a call the user did not make."""
    return "trackable_obj" not in record.getMessage()


class Fingerprint(NamedTuple):
    """``fingerprint``'s answer: the digest, and what it hashed (for the log)."""

    digest: str
    graph_bytes: int
    values: int
    value_bytes: int


def fingerprint(concrete: Any) -> Fingerprint:
    """The SHA-256 of everything ``to_tflite`` reads, so that functions with equal
    fingerprints convert to the same flatbuffer, and a cache hit needs no
    conversion. It hashes:

    - TF's version and this module's source: the converter and its settings;
    - the traced graph with its function library (ops, attributes, edges, node
      names, the inputs' dtypes and static shapes), serialized deterministically;
    - the graph's inputs and outputs by name, and their Python structure;
    - each capture's value, in the graph's order, as the converter freezes it: a
      variable's (Keras weights) or a captured tensor's dtype, shape and bytes.

    Node and function names are hashed as they are: the same model built, or
    loaded, the same way in another process fingerprints the same, but a second
    model of one architecture in one process does not (Keras numbers its layers:
    ``dense_1``), nor does a function that calls other tf.functions (a loaded
    SavedModel's) where the process traced other functions first (TF numbers
    them). Those miss the cache; nothing that converts differently hits it."""
    graph = concrete.graph
    sha = hashlib.sha256()

    def add(data: bytes) -> None:  # length-prefixed: no two sequences of parts hash alike
        sha.update(len(data).to_bytes(8, "little"))
        sha.update(data)

    add(f"tf {tf.version.VERSION} {tf.version.GIT_VERSION}; conversion {_source_digest()}".encode())
    graph_def = graph.as_graph_def().SerializeToString(deterministic=True)
    add(graph_def)
    add(repr([t.name for t in graph.inputs]).encode())
    add(repr(tf.nest.map_structure(lambda t: t.name, concrete.structured_outputs)).encode())
    add(repr(concrete.structured_input_signature).encode())

    # The converter's own match of values to captures (convert_variables_to_constants_v2):
    # a capture is a variable's if it is that variable's handle.
    variables = {id(v.handle): v for v in graph.variables}
    values = value_bytes = 0
    for external, internal in graph.captures:
        variable = variables.get(id(external))
        if variable is not None:
            value = variable.read_value()
        elif external.dtype == tf.resource:
            # Not a variable (a lookup table): the converter leaves it a resource
            # placeholder, which no flatbuffer can hold, so a function that reads
            # it fails to convert and is never cached; its state cannot matter.
            add(f"{internal.name}: unfrozen resource".encode())
            continue
        else:
            value = external
        # The TensorProto: dtype, shape and contents, strings included.
        serialized = tf.io.serialize_tensor(value).numpy()
        add(internal.name.encode())
        add(serialized)
        values += 1
        value_bytes += len(serialized)
    return Fingerprint(sha.hexdigest(), len(graph_def), values, value_bytes)


@functools.lru_cache(maxsize=None)
def _source_digest() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
