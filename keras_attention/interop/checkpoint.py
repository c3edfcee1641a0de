"""`Checkpoint`: the tensors of a Hugging Face safetensors checkpoint,
read one at a time with NumPy alone (no torch, no `safetensors` package).

A checkpoint directory, as `transformers`' `save_pretrained` writes it,
holds `model.safetensors`, or shards listed by
`model.safetensors.index.json` (`{"weight_map": {tensor name: shard
file}}`). A safetensors file is an 8-byte little-endian header length
`N`, a JSON header of `N` bytes (`{name: {"dtype", "shape",
"data_offsets": [begin, end]}}`, offsets counted from the end of the
header) and the tensors' bytes. `Checkpoint` reads the headers only when
opened; `read(name)` reads one tensor's bytes from its file into a fresh
NumPy array (a `readinto`, not a memory map: the file's pages never count
towards the process's memory), so that loading a model holds one tensor
besides the model's weights at a time. bfloat16 and float8 tensors come
as `ml_dtypes` arrays (the package Keras and TensorFlow depend on).

Pickled checkpoints (`pytorch_model.bin`) are never read: unpickling
runs code from the file.
"""

import json
import os

import ml_dtypes
import numpy as np

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")

# safetensors dtype names -> NumPy dtypes (little-endian).
DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("bool"),
}
_HEADER_LIMIT = 100 * 2**20  # the safetensors format's own limit


class TensorInfo:
    """Where one tensor lies: its `file`, `dtype` (NumPy), `shape` and
    byte `offset` in the file."""

    __slots__ = ("name", "file", "dtype", "shape", "offset")

    def __init__(self, name, file, dtype, shape, offset):
        self.name = name
        self.file = file
        self.dtype = dtype
        self.shape = shape
        self.offset = offset

    @property
    def nbytes(self):
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def read_header(path):
    """`{name: TensorInfo}` of one safetensors file (its `__metadata__`
    left out). `ValueError` naming the file for a malformed header, an
    unknown dtype or a tensor whose bytes do not match its shape or lie
    past the file's end."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < length <= min(_HEADER_LIMIT, size - 8):
            raise ValueError(
                f"{path!r} is not a safetensors file (header length "
                f"{length!r}, file size {size!r})."
            )
        try:
            header = json.loads(f.read(length))
        except ValueError as error:
            raise ValueError(
                f"{path!r} has a malformed safetensors header: {error}"
            ) from None
    start = 8 + length
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = DTYPES.get(entry.get("dtype"))
        if dtype is None:
            raise ValueError(
                f"Tensor {name!r} of {path!r} has dtype "
                f"{entry.get('dtype')!r}, not one of {sorted(DTYPES)}."
            )
        shape = tuple(int(n) for n in entry["shape"])
        begin, end = (int(n) for n in entry["data_offsets"])
        info = TensorInfo(name, path, dtype, shape, start + begin)
        if end - begin != info.nbytes or start + end > size:
            raise ValueError(
                f"Tensor {name!r} of {path!r}: its bytes {begin}..{end} do "
                f"not hold a {entry['dtype']} tensor of shape {shape!r} "
                f"within the file ({size - start} bytes of data)."
            )
        tensors[name] = info
    return tensors


class Checkpoint:
    """The tensors of a safetensors checkpoint directory.

    Args:
        directory: a directory with `model.safetensors`, or shards and
            `model.safetensors.index.json`.

    Raises:
        ValueError: the directory holds no safetensors checkpoint (a
            pickled `pytorch_model.bin` is named, never read), or a file
            is malformed.

    Example:

    >>> import tempfile, pathlib
    >>> import numpy as np
    >>> from safetensors.numpy import save_file
    >>> from keras_attention.interop.checkpoint import Checkpoint
    >>> directory = pathlib.Path(tempfile.mkdtemp())
    >>> save_file({"w": np.ones((2, 3), "float32")},
    ...     str(directory / "model.safetensors"))
    >>> checkpoint = Checkpoint(directory)
    >>> checkpoint.shape("w"), checkpoint.read("w").sum()
    ((2, 3), np.float32(6.0))
    """

    def __init__(self, directory):
        directory = os.fspath(directory)
        self.directory = directory
        single = os.path.join(directory, SINGLE_FILE)
        index = os.path.join(directory, INDEX_FILE)
        if os.path.isfile(index):
            files = self._shards(index)
        elif os.path.isfile(single):
            files = [single]
        else:
            raise ValueError(no_safetensors_message(directory))
        self.tensors = {}
        for path in files:
            self.tensors.update(read_header(path))
        if os.path.isfile(index):
            self._check_index(index)

    def _shards(self, index):
        with open(index, encoding="utf-8") as f:
            self._weight_map = json.load(f).get("weight_map") or {}
        shards = sorted(set(self._weight_map.values()))
        missing = [
            s
            for s in shards
            if not os.path.isfile(os.path.join(self.directory, s))
        ]
        if not shards or missing:
            raise ValueError(
                f"{index!r} lists shards that are not in the directory: "
                f"{missing or shards!r}."
            )
        return [os.path.join(self.directory, s) for s in shards]

    def _check_index(self, index):
        for name, shard in self._weight_map.items():
            info = self.tensors.get(name)
            if info is None or os.path.basename(info.file) != shard:
                raise ValueError(
                    f"{index!r} puts tensor {name!r} in {shard!r}, which "
                    "does not hold it."
                )

    def names(self):
        """The tensor names, file by file, each file's in byte order (the
        order that reads each file front to back)."""
        return [
            info.name
            for info in sorted(
                self.tensors.values(), key=lambda t: (t.file, t.offset)
            )
        ]

    def __contains__(self, name):
        return name in self.tensors

    def shape(self, name):
        """The stored shape of tensor `name`."""
        return self.tensors[name].shape

    def dtype(self, name):
        """The stored NumPy dtype of tensor `name`."""
        return self.tensors[name].dtype

    def nbytes(self):
        """The bytes of all tensors."""
        return sum(info.nbytes for info in self.tensors.values())

    def read(self, name):
        """Tensor `name` as a new NumPy array of its stored dtype."""
        info = self.tensors[name]
        if not info.shape:
            return self._read_bytes(info, 0, info.nbytes).reshape(())
        return self.read_rows(name, 0, info.shape[0])

    def read_rows(self, name, start, stop):
        """Rows `start .. stop - 1` (along the first axis) of tensor
        `name`, as a new NumPy array of its stored dtype."""
        info = self.tensors[name]
        if not info.shape or not 0 <= start <= stop <= info.shape[0]:
            raise ValueError(
                f"Rows {start}..{stop} are not rows of tensor {name!r} of "
                f"shape {info.shape!r}."
            )
        row = info.nbytes // info.shape[0] if info.shape[0] else 0
        values = self._read_bytes(info, start * row, (stop - start) * row)
        return values.reshape((stop - start,) + info.shape[1:])

    @staticmethod
    def _read_bytes(info, begin, count):
        buffer = np.empty(count, np.uint8)
        with open(info.file, "rb") as f:
            f.seek(info.offset + begin)
            if f.readinto(memoryview(buffer)) != count:
                raise ValueError(
                    f"Tensor {info.name!r} of {info.file!r} ends past the file."
                )
        return buffer.view(info.dtype)

    def floating_dtype(self):
        """The dtype name most of the floating tensors' bytes are stored
        in ("float32", "bfloat16", ...), or None without floating
        tensors."""
        totals = {}
        for info in self.tensors.values():
            if np.issubdtype(info.dtype, np.floating) or info.dtype in (
                DTYPES["BF16"],
                DTYPES["F8_E4M3"],
                DTYPES["F8_E5M2"],
            ):
                totals[info.dtype] = totals.get(info.dtype, 0) + info.nbytes
        if not totals:
            return None
        return max(totals, key=totals.get).name


def no_safetensors_message(directory):
    """Why `directory` cannot be loaded: no safetensors checkpoint (and,
    when there is one, that a pickled checkpoint is never loaded)."""
    pickled = [
        name
        for name in PICKLE_FILES
        if os.path.isfile(os.path.join(directory, name))
    ]
    if pickled:
        return (
            f"{directory!r} holds only a pickled PyTorch checkpoint "
            f"({', '.join(pickled)}), which is never loaded (unpickling "
            "runs code from the file). Convert the checkpoint to "
            "safetensors first, e.g. with transformers: "
            "`AutoModelForCausalLM.from_pretrained(directory)."
            "save_pretrained(directory, safe_serialization=True)`, or "
            "download the hub repository's safetensors files."
        )
    return (
        f"{directory!r} holds no safetensors checkpoint: neither "
        f"{SINGLE_FILE!r} nor {INDEX_FILE!r}."
    )
