"""The Python API: TVM modules and their functions as TensorFlow ops."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import numbers
import os
import stat
from collections.abc import Mapping, Sequence
from typing import Any, Union

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context, record  # op callbacks, tapes: TF has no public way to ask

from tf_op import _eager, _library

#: What an output shape may be: a list of ints; None for the shape of the first
#: input; a 1-D int32/int64 tensor; or a list mixing ints and scalar int tensors.
#: Tensors are read at every call, so they may change between calls.
ShapeLike = Union[Sequence[Union[int, tf.Tensor, tf.Variable]], tf.TensorShape, tf.Tensor, tf.Variable, None]
#: What an output dtype may be: a ``tf.DType``, a dtype name, or None for the
#: dtype of the first input.
DTypeLike = Union[tf.DType, str, np.dtype, None]


class Module(tf.Module):
    """A TVM module: a library made by TVM's ``export_library``, or any library
    exporting TVM-FFI functions.

    The path is checked when the Module is made: a missing file
    (``FileNotFoundError``), a directory (``IsADirectoryError``) or a file that is
    not a shared library this process could load (``ValueError``) is refused
    then, read with the op library's ELF reader, before anything of the file
    runs. The library is loaded by the op, once per process per path, when a
    function of it first runs; what goes wrong then (a library changed on disk,
    one that fails to load) is reported as a ``tf.errors.OpError`` naming the path.

    A Module is trackable: kept on a ``tf.Module`` or Keras layer (directly or
    through a function made from it), its library is saved into SavedModels as an
    asset, and loaded models find it in their own ``assets/`` folder wherever they
    are copied. The library's SHA-256 is recorded in the graph, and the op refuses
    a file with another one.

    Args:
      lib_path: the library's path.
      sha256: the SHA-256 (hex) the library must have; by default, that of the
        file now at lib_path, once a process of its own (tvmdsoop-probe) has
        loaded it without crashing. Pass ``""`` for no check (the op then
        probes the library when it loads it).
      graph_json, params: a graph-executor model of ``relay.build`` (TVM
        0.8-0.20) given as three files: lib_path is its library
        (``lib.export_library``), graph_json its graph (``get_graph_json()``)
        and params its params (``relay.save_param_dict``). The Module is then a
        whole model whose one function, ``default``, takes the graph's inputs
        that are not params. Both files are pinned to their SHA-256 now, and
        travel with SavedModels as assets. (A one-file model, ``export_library``
        of relay.build's result, needs neither: it is a model by itself.)
    """

    def __init__(
        self,
        lib_path: str | bytes | os.PathLike[str],
        sha256: str | None = None,
        *,
        graph_json: str | bytes | os.PathLike[str] | None = None,
        params: str | bytes | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(lib_path, (str, bytes, os.PathLike)):
            raise TypeError(f"tf_op: lib_path must be a path (str, bytes or os.PathLike), got {type(lib_path).__name__}")
        if sha256 is not None and not isinstance(sha256, str):
            raise TypeError(f"tf_op: sha256 must be a hex string or None, got {type(sha256).__name__}")
        path = os.fsdecode(lib_path)
        if "\0" in path:
            raise ValueError(f"tf_op: library path {path!r} holds a NUL byte")
        if not path:
            # os.path.abspath("") is the current directory: refused here, not there.
            raise ValueError("tf_op: the library path is empty")
        self.lib_path = os.path.abspath(path)
        inspection = _check_library_file(self.lib_path)
        # The digest of a library the user did not pin is that of the bytes the
        # probe process loaded first (a library that would take this process
        # down fails here); the op trusts a digest it is given. One outside the
        # allow-list is not probed: the op refuses it.
        if sha256 is not None:
            self._sha256 = sha256.lower()
        else:
            self._sha256 = _library.probe(self.lib_path) or str(inspection["sha256"])
        # An Asset, so that SavedModels copy the library and point the op at the copy.
        self._library = tf.saved_model.Asset(self.lib_path)
        self._description: dict[str, Any] | None = None
        #: A three-file relay.build model's graph JSON and params: their paths,
        #: digests and assets; empty for any other library.
        self.graph_files: tuple[str, ...] = ()
        self._graph_sha256: list[str] = []
        self._graph_assets: list[tf.saved_model.Asset] = []
        if (graph_json is None) != (params is None):
            raise ValueError("tf_op: a relay.build model of three files needs both graph_json and params")
        if graph_json is not None:
            for what, p in (("graph_json", graph_json), ("params", params)):
                if not isinstance(p, (str, bytes, os.PathLike)):
                    raise TypeError(f"tf_op: {what} must be a path, got {type(p).__name__}")
                file = os.path.abspath(os.fsdecode(p))
                if "\0" in file:
                    raise ValueError(f"tf_op: {what} path {file!r} holds a NUL byte")
                if not os.path.isfile(file):
                    raise FileNotFoundError(f"tf_op: the {what} file {file} does not exist")
                self.graph_files += (file,)
                self._graph_sha256.append(file_sha256(file))
                self._graph_assets.append(tf.saved_model.Asset(file))

    @property
    def sha256(self) -> str:
        """The SHA-256 (hex) the op requires of the library; "" for none.

        Taken from the file when the Module is made, unless given then."""
        return self._sha256

    def _describe(self) -> dict[str, Any]:
        """What the op library sees in the library (see ``_library.describe``):
        asked once the file exists."""
        if self._description is None:
            if not os.path.isfile(self.lib_path):
                return {"model": False, "error": "the library file does not exist"}
            self._description = _library.describe(self.lib_path, self.sha256)
        return self._description

    @property
    def is_model(self) -> bool:
        """Whether the library is a whole model: a Relax VM executable
        (``tvm.compile`` of Relax functions, then ``export_library``), or a
        graph-executor model of ``relay.build`` (one file, or three: see
        ``graph_json``). A model's functions return their outputs. False for a
        library that does not load (yet): the op reports why when it runs."""
        return bool(self.graph_files) or bool(self._describe().get("model"))

    def functions(self) -> list[str]:
        """The functions a caller may name, sorted: a whole model's entry points
        (``main``, ``forward``, ...), or the functions the library exports (its
        ``__tvm_ffi_<name>`` symbols; a library of TVM <= 0.21, its own names).
        Empty when the library does not load: the op reports why when it runs."""
        if self.graph_files:
            return ["default"]  # a three-file model's one function, as relay.build names it
        return list(self._describe().get("functions") or [])

    @property
    def cpu_level(self) -> str:
        """The x86-64 level whose code runs, for a library that holds several
        (``tf_op.compile``'s default target, ``"portable"``): the highest this
        CPU has, or at most ``$TVMDSOOP_CPU_LEVEL``; "" for other libraries."""
        return str(self._describe().get("cpu_level") or "")

    @property
    def library_path(self) -> tf.Tensor:
        """The library's path as a tensor: the copy in a loaded SavedModel.

        TF1 graphs (no eager context, no function being traced) cannot capture
        the asset's eager tensor; they get the path as a constant."""
        if _in_tf1_graph():
            return tf.constant(self.lib_path)
        return self._library.asset_path

    @property
    def model_paths(self) -> list[tf.Tensor]:
        """A three-file model's library, graph JSON and params paths, as
        ``library_path`` gives the library's (the copies in a loaded SavedModel)."""
        if _in_tf1_graph():
            return [tf.constant(p) for p in (self.lib_path, *self.graph_files)]
        return [self._library.asset_path] + [a.asset_path for a in self._graph_assets]

    def func(
        self,
        name: str,
        output_shape: ShapeLike = None,
        output_dtype: DTypeLike = None,
        alignment: int = 64,
        *,
        output_shapes: Sequence[ShapeLike] | None = None,
        output_dtypes: Sequence[DTypeLike] | None = None,
        device: str | None = None,
        returns: bool | None = None,
        grad: str | Func | None = None,
        inplace: Mapping[int, int] | None = None,
    ) -> Func:
        """The function ``name`` of the module, as a callable that adds a TVMDSOOp.

        Two kinds of functions: those that write outputs TensorFlow allocates
        (TVM's destination-passing style: ``tvm.compile`` of TIR functions,
        ``export_library``), and those that return their outputs: every function
        of a whole model (``is_model``), and others made with ``returns=True``.

        Args:
          name: the function's name in the library.
          output_shape: the output's shape (see ``ShapeLike``); None means the
            shape of the first input. For a returning function: the shape the
            output must have, as ints with None for dimensions not checked (a
            symbolic batch), or None for any shape; the op checks what comes back.
          output_dtype: the output's dtype; None means the dtype of the first input.
          alignment: the least alignment in bytes (a power of two) of the buffers
            handed to TVM; misaligned ones are copied through aligned memory.
          output_shapes, output_dtypes: several outputs, one entry each (None
            entries as above); the call then returns a tuple. Give these or
            output_shape/output_dtype, not both.
          device: a TF device ("/CPU:0") to pin the op to; None follows TF's
            placement (``with tf.device(...)``).
          returns: whether the function returns its outputs. None: only when the
            library is a whole model (which ``False`` cannot change).
          grad: the function giving the gradient, so that TensorFlow can
            differentiate through this one (docs/usage.md, "Training"): the name
            of a function of this module, made like this one (same alignment,
            returning or not), or a ``Func`` of any module; a function of another
            module travels with SavedModels as an asset of its own. It is called
            with the inputs, the outputs and one upstream gradient per output,
            and gives one gradient per floating-point or complex input, in order.
          inplace: ``{output: input}``: outputs the function may write over an
            input's buffer (an element-wise function can). TensorFlow hands the
            buffer over only when nothing else uses the input (else the output
            is allocated, and the input keeps its values); the dtypes must match.
            Not for functions that return their outputs.
        """
        if self.is_model and returns is False:
            raise ValueError(f"tf_op: {self.lib_path} is a whole model: its function {name!r} returns its outputs")
        if self.graph_files and grad is not None:
            raise ValueError(f"tf_op: {self.lib_path}: a relay.build model of three files takes no grad")
        returns = bool(returns) or self.is_model
        if isinstance(grad, str):
            grad = Func(self, grad, None, None, alignment, device=device, returns=returns)
        return Func(
            self, name, output_shape, output_dtype, alignment,
            output_shapes=output_shapes, output_dtypes=output_dtypes, device=device,
            returns=returns, grad=grad, inplace=inplace,
        )

    def __getitem__(self, name: str) -> Func:
        return self.func(name)

    def __repr__(self) -> str:
        return f"tf_op.Module({self.lib_path!r})"


class OpModule(Module):
    """``tvm.contrib.tf_op.OpModule``'s interface, for code written against it.

    Its ``func`` takes the dtype first and makes float32 outputs unless told
    otherwise, as the old one did (``func(name, output_dtype=None,
    output_shape=None)``); ``Module.func`` takes the shape first and defaults the
    dtype to the first input's. Everything else is ``Module``'s."""

    def func(  # type: ignore[override]
        self, name: str, output_dtype: DTypeLike = None, output_shape: ShapeLike = None, **options: Any
    ) -> Func:
        """The function ``name``; ``options`` are ``Module.func``'s keywords."""
        return super().func(
            name, output_shape=output_shape, output_dtype=tf.float32 if output_dtype is None else output_dtype, **options
        )


#: The largest size of a dimension: TF's shapes hold int64.
_MAX_DIM = 2**63 - 1

#: The largest alignment accepted (1 GiB): beyond any hardware's need.
_MAX_ALIGNMENT = 1 << 30


@dataclasses.dataclass
class _EagerAttrs:
    """The op's arguments of a function's eager calls, by the dtype of the first
    input where an output takes it (Func._op_attrs); a plain object, out of
    tf.Module's tracking, as they hold the library's tensor."""

    attrs: dict[tf.DType | None, dict[str, Any]] = dataclasses.field(default_factory=dict)
    #: The function's entry for eager calls without the op (tf_op._eager): None
    #: until the first eager call makes it, False where the op always runs.
    call: _eager.EagerFunction | None | bool = None


@dataclasses.dataclass(frozen=True)
class _Outputs:
    """A function's output declarations, kept apart from tf.Module's tracking."""

    shapes: tuple[ShapeLike, ...]
    dtypes: tuple[tf.DType | None, ...]
    #: The op's ``inplace`` attr: per output, the input it may be written over
    #: (-1: none); empty when none may.
    inplace: tuple[int, ...]


class Func(tf.Module):
    """A function of a TVM module. Calling it with tensors adds a TVMDSOOp that
    passes them, then the outputs TensorFlow allocates, to the TVM function, and
    returns the output (or, when made with output_shapes/output_dtypes, a tuple).

    Trackable, like its Module: saved with the object that holds it."""

    def __init__(
        self,
        module: Module,
        name: str,
        output_shape: ShapeLike,
        output_dtype: DTypeLike,
        alignment: int,
        *,
        output_shapes: Sequence[ShapeLike] | None = None,
        output_dtypes: Sequence[DTypeLike] | None = None,
        device: str | None = None,
        returns: bool = False,
        grad: Func | None = None,
        inplace: Mapping[int, int] | None = None,
    ) -> None:
        super().__init__()
        self.module = module
        self.returns = returns
        self.func_name = name
        if not isinstance(name, str) or not name or "\0" in name:
            raise ValueError(f"tf_op: function name must be a non-empty string without NUL bytes, got {name!r}")
        if grad is not None and not isinstance(grad, Func):
            raise TypeError(f"tf_op: {self}: grad must be a function name or a tf_op.Func, got {type(grad).__name__}")
        #: The function giving this one's gradient; tracked, so that SavedModels
        #: carry its library too.
        self.grad = grad
        if not _is_int(alignment) or not 1 <= alignment <= _MAX_ALIGNMENT or alignment & (alignment - 1):
            raise ValueError(
                f"tf_op: {self}: alignment must be a power of two from 1 to {_MAX_ALIGNMENT}, got {alignment!r}"
            )
        alignment = int(alignment)
        self.multiple_outputs = output_shapes is not None or output_dtypes is not None
        if self.multiple_outputs:
            if output_shape is not None or output_dtype is not None:
                raise ValueError(f"tf_op: {self}: give output_shapes/output_dtypes or output_shape/output_dtype, not both")
            if output_shapes is not None and output_dtypes is not None and len(output_shapes) != len(output_dtypes):
                raise ValueError(
                    f"tf_op: {self}: {len(output_shapes)} output_shapes but {len(output_dtypes)} output_dtypes"
                )
            count = len(output_shapes if output_shapes is not None else output_dtypes)
            if count == 0:
                raise ValueError(f"tf_op: {self}: a function needs at least one output")
            shapes = list(output_shapes) if output_shapes is not None else [None] * count
            dtypes = list(output_dtypes) if output_dtypes is not None else [None] * count
        else:
            shapes, dtypes = [output_shape], [output_dtype]
        for i, shape in enumerate(shapes):
            if returns:
                _check_returned_shape(shape, f"tf_op: {self}: output {i} shape")
            else:
                _check_shape(shape, f"tf_op: {self}: output {i} shape")
        self._outputs = _Outputs(
            tuple(shapes),
            tuple(None if d is None else tf.as_dtype(d) for d in dtypes),
            self._inplace_attr(inplace, len(shapes)),
        )
        # Variables giving sizes are tracked, so that they are saved with the function.
        self._shape_variables = [v for v in _flatten(shapes) if isinstance(v, tf.Variable)]
        self.alignment = alignment
        self.device = device
        self._eager = _EagerAttrs()

    @property
    def output_shapes(self) -> list[ShapeLike]:
        return list(self._outputs.shapes)

    @property
    def output_dtypes(self) -> list[tf.DType | None]:
        return list(self._outputs.dtypes)

    @property
    def inplace(self) -> dict[int, int]:
        """``{output: input}``: the outputs that may be written over an input."""
        return {o: i for o, i in enumerate(self._outputs.inplace) if i >= 0}

    def _inplace_attr(self, inplace: Mapping[int, int] | None, num_outputs: int) -> tuple[int, ...]:
        """The op's inplace attr for ``{output: input}``. The inputs' count and
        dtypes are known when the op is made: the op checks those."""
        if not inplace:
            return ()
        if not isinstance(inplace, Mapping):
            raise TypeError(f"tf_op: {self}: inplace must map outputs to inputs ({{0: 0}}), got {inplace!r}")
        if self.returns:
            raise ValueError(f"tf_op: {self}: returns its outputs, so none can be written over an input (inplace)")
        attr = [-1] * num_outputs
        for o, i in inplace.items():
            if not _is_int(o) or not 0 <= o < num_outputs or not _is_int(i) or i < 0:
                raise ValueError(
                    f"tf_op: {self}: inplace maps an output (0 to {num_outputs - 1}) to an input (>= 0), "
                    f"got {o!r}: {i!r}"
                )
            attr[o] = int(i)
        return tuple(attr)

    def __call__(self, *args: Any) -> tf.Tensor | tuple[tf.Tensor, ...]:
        # Tensors go in as they are: tf.convert_to_tensor returns a tensor
        # itself, at 2 µs (a third of an eager call through the entry).
        inputs = [a if isinstance(a, tf.Tensor) else self._converted(a) for a in args]
        outputs = self.run(inputs)
        return tuple(outputs) if self.multiple_outputs else outputs[0]

    def _converted(self, arg: Any) -> tf.Tensor:
        """``arg`` (an array, a number, a variable...) as a tensor, made on the
        function's device."""
        with tf.device(self.device) if self.device is not None else contextlib.nullcontext():
            return tf.convert_to_tensor(arg)

    def run(self, inputs: list[tf.Tensor]) -> list[tf.Tensor]:
        """The op's outputs, a list, for ``inputs``: tensors already, which it
        passes as they are (``__call__`` converts its arguments first; a
        conversion costs about 3 µs an input), on the device ``__call__`` gives
        it, if any. An eager call that nothing watches, of a function that
        returns its outputs, calls it without TF's op dispatch (tf_op._eager)."""
        if self._eager.call is not False and tf.executing_eagerly() and not record.could_possibly_record():
            outputs = self.entry_outputs(inputs)
            if outputs is not None:
                return outputs
        with tf.device(self.device) if self.device is not None else contextlib.nullcontext():
            dims, attrs = self._op_attrs(inputs)
            return _library.load().tvmdso_op(
                args=inputs,
                output_dims=dims,  # none when every shape is static: no input for TF to deliver
                **attrs,
            )

    def entry_outputs(self, inputs: list[tf.Tensor]) -> list[tf.Tensor] | None:
        """The outputs for ``inputs`` from the op library's eager entry, for a
        caller that knows the call is eager and that no tape could record it (a
        gradient needs the op); None where the op must run: an op callback
        (which must see the op), a function or input the entry does not take."""
        if context.context().op_callbacks:
            return None
        call = self._eager.call
        if call is None:
            call = self._eager.call = self._eager_call()
        return call(inputs) if call is not False else None

    def _eager_call(self) -> _eager.EagerFunction | bool:
        """The eager entry for this function, or False where the op always runs:
        a function with output buffers, a relay.build model, a GPU TF could put
        the op on, ``TVMDSOOP_EAGER_ENTRY=0`` (every eager call an op that TF's
        profiler and tracing see), an op library built without the entry."""
        device = tf.DeviceSpec.from_string(self.device).device_type if self.device is not None else None
        if (os.environ.get("TVMDSOOP_EAGER_ENTRY", "1") == "0" or not self.returns or self.module.graph_files
                or device not in (None, "CPU") or (device is None and _eager.tf_may_place_on_a_gpu())
                or not _eager.available()):
            return False
        declared = [(dtype, _checked_dims(shape)) for shape, dtype in zip(self._outputs.shapes, self._outputs.dtypes)]
        path = self.module.library_path.numpy().decode()
        return _eager.open_function(path, self.func_name, self.module.sha256, declared, self.alignment)

    def _op_attrs(self, inputs: list[tf.Tensor]) -> tuple[list[tf.Tensor], dict[str, Any]]:
        """The op's run-time output sizes and its other arguments, for these inputs.

        Called eagerly, a function whose output sizes are all static makes its
        arguments once per dtype of its first input (which the outputs of no
        declared dtype take): they were a third of an eager call of a small
        compiled model (about 10 of 35 µs)."""
        eager = tf.executing_eagerly()
        key = inputs[0].dtype if inputs and None in self._outputs.dtypes else None
        # No assignment expression here: AutoGraph, which converts what a
        # tf.function calls, cannot read one and warns.
        made = self._eager.attrs.get(key) if eager else None
        if made is not None:
            return [], made
        dtypes = []
        for i, dtype in enumerate(self.output_dtypes):
            if dtype is None and not inputs:
                raise ValueError(f"tf_op: {self}: output {i} takes the first input's dtype, but there is no input")
            dtypes.append(dtype if dtype is not None else inputs[0].dtype)
        shapes, dims = [], []
        for i, shape in enumerate(self.output_shapes):
            if self.returns:
                shapes.append(tf.TensorShape(shape))
                continue
            if shape is None and not inputs:
                raise ValueError(f"tf_op: {self}: output {i} takes the first input's shape, but there is no input")
            static, dynamic = _shape_attr(shape, f"tf_op: {self}: output {i} shape")
            shapes.append(static)
            dims.extend(dynamic)
        library, attrs = self._library_and_grad()
        if self._outputs.inplace:
            attrs["inplace"] = list(self._outputs.inplace)
        attrs.update(library=library, Tout=dtypes, output_shapes=shapes, func_name=self.func_name,
                     lib_sha256=self.module.sha256, alignment=self.alignment, returns=self.returns)
        if eager and not dims:
            self._eager.attrs[key] = attrs
        return dims, attrs

    def _library_and_grad(self) -> tuple[tf.Tensor, dict[str, Any]]:
        """The op's ``library`` input and its gradient attrs (tf_op.gradients reads
        them). A gradient in another library adds that library's path to the input,
        a vector then, so that a SavedModel holds it as an asset too. A relay.build
        model of three files has its graph JSON and params after its library
        (and no gradient)."""
        if self.module.graph_files:
            return tf.stack(self.module.model_paths), {"graph_sha256": list(self.module._graph_sha256)}
        if self.grad is None:
            return self.module.library_path, {}
        attrs = {"grad_func": self.grad.func_name, "grad_returns": self.grad.returns}
        if self.grad.module.lib_path == self.module.lib_path:
            return self.module.library_path, attrs
        attrs["grad_lib_sha256"] = self.grad.module.sha256
        return tf.stack([self.module.library_path, self.grad.module.library_path]), attrs

    def __repr__(self) -> str:
        return f"function {self.func_name!r} of {self.module.lib_path}"


def _checked_dims(shape: ShapeLike) -> tuple[int | None, ...] | None:
    """A returning function's declared shape as the tuple its outputs are
    checked against (None where a dimension is free), or None: not checked."""
    if shape is None:
        return None
    shape = tf.TensorShape(shape)
    return None if shape.rank is None else tuple(shape.as_list())


def _in_tf1_graph() -> bool:
    """Building a TF1 graph (no eager context, no function being traced): such
    graphs cannot capture eager tensors and get constants of their own."""
    return not tf.executing_eagerly() and not tf.compat.v1.get_default_graph().building_function


#: The first bytes of every ELF file, shared libraries among them.
_ELF_MAGIC = b"\x7fELF"


def _check_library_file(path: str) -> dict[str, Any]:
    """What the op library's ELF reader says of the file at path (see
    ``_library.inspect``), or the error a Module made of it raises: a path that
    cannot be a library is refused when the Module is made, in plain words,
    rather than at its first call, deep in a graph being traced."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"tf_op: the library {path} does not exist") from None
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(f"tf_op: the library path {path} is a directory, not a library file")
    if not stat.S_ISREG(st.st_mode):
        # A device or a FIFO: reading one could block forever.
        raise ValueError(f"tf_op: the library path {path} is not a regular file (a device, a FIFO or a socket)")
    with open(path, "rb") as f:
        head = f.read(len(_ELF_MAGIC))
    if head != _ELF_MAGIC:
        begins = f"it starts with {head.decode('latin-1')!r}" if head else "it is empty"
        raise ValueError(f"tf_op: {path} is not a shared library (an ELF file): {begins}")
    inspection = _library.inspect(path)
    if inspection.get("not_found"):  # gone since: taken away between the two looks
        raise FileNotFoundError(f"tf_op: the library {path} does not exist")
    if "error" in inspection:
        raise ValueError(f"tf_op: {path} is not a shared library this process can load: {inspection['error']}")
    return inspection


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a file, hex, read in blocks (libraries can be large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _flatten(shapes: Sequence[ShapeLike]) -> list[Any]:
    flat: list[Any] = []
    for shape in shapes:
        if isinstance(shape, (list, tuple)):
            flat.extend(shape)
        else:
            flat.append(shape)
    return flat


def _is_tensor(value: Any) -> bool:
    return isinstance(value, (tf.Tensor, tf.Variable)) or tf.is_tensor(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_shape(shape: ShapeLike, where: str) -> None:
    """Rejects malformed shapes when the function is made; tensor values are
    checked by the op when it runs."""
    if shape is None or _is_tensor(shape):
        return
    if isinstance(shape, tf.TensorShape):
        if shape.rank is None or not shape.is_fully_defined():
            raise ValueError(f"{where} must be fully defined, got {shape}")
        return
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
        raise ValueError(f"{where} must be a list of ints, a 1-D int tensor or None, got {shape!r}")
    for d in shape:
        if _is_tensor(d):
            continue
        if not _is_int(d) or d < 0:
            raise ValueError(f"{where} must hold ints >= 0 or scalar int tensors, got {shape!r}")
        if d > _MAX_DIM:
            raise ValueError(f"{where}: size {d} does not fit TensorFlow's int64 dimensions")


def _check_returned_shape(shape: ShapeLike, where: str) -> None:
    """A returning function's declared shape: what it returns is checked against
    it, so it holds ints and None (a dimension not checked), never tensors."""
    if shape is None:
        return
    if isinstance(shape, tf.TensorShape):
        return
    if _is_tensor(shape) or isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
        raise ValueError(f"{where}: a function that returns its outputs takes a list of ints and None, got {shape!r}")
    for d in shape:
        if d is not None and (not _is_int(d) or d < 0 or d > _MAX_DIM):
            raise ValueError(f"{where}: a function that returns its outputs takes a list of ints >= 0 and None, got {shape!r}")


def _shape_attr(shape: ShapeLike, where: str) -> tuple[tf.TensorShape, list[tf.Tensor]]:
    """The op's view of one output shape: its ``output_shapes`` entry (-1 where the
    size comes at run time; unknown rank for "the first input's") and the int64
    tensors that give the run-time sizes."""
    if shape is None:
        return tf.TensorShape(None), []
    if _is_tensor(shape):
        t = _int_tensor(shape, where)
        if t.shape.rank != 1 or t.shape[0] is None:
            raise ValueError(f"{where}: a shape tensor must be 1-D with a static length, got shape {t.shape}")
        return tf.TensorShape([None] * t.shape[0]), [t]
    if isinstance(shape, tf.TensorShape):
        return shape, []
    dims, dynamic = [], []
    for d in shape:
        if _is_tensor(d):
            t = _int_tensor(d, where)
            if t.shape.rank != 0:
                raise ValueError(f"{where}: tensors in a shape list must be scalars, got shape {t.shape}")
            dims.append(None)
            dynamic.append(t)
        else:
            dims.append(int(d))
    return tf.TensorShape(dims), dynamic


def _int_tensor(value: Any, where: str) -> tf.Tensor:
    t = tf.convert_to_tensor(value)
    if t.dtype not in (tf.int32, tf.int64):
        raise ValueError(f"{where}: shape tensors must be int32 or int64, got {t.dtype.name}")
    return tf.cast(t, tf.int64)
