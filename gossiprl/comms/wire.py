"""The gossiprl wire format: the one module the broker and the client share.

A message is a list of frames: a msgpack header, then one raw frame per tensor.
Encoding never copies a contiguous array (the frame points at its memory);
decoding hands back numpy views on the received frames. Everything that arrives is
validated here before anyone acts on it, and nothing received is ever executed: the
header is plain msgpack data, the payload plain bytes. PROTOCOL.md is the normative text.

No socket lives here, and only numpy arrays: ``pack_tensors`` turns a dict of them into a
schema and buffers, ``unpack_tensors`` turns frames back. Other libraries' tensors reach the
wire through ``gossiprl.comms.tensors``, which brings them to host memory in their wire dtype first.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

PROTOCOL_VERSION = 1

# Client -> broker, then broker -> client. PROTOCOL.md gives each one's fields.
HELLO, PUBLISH, COLLECT, PING, BYE = "HELLO", "PUBLISH", "COLLECT", "PING", "BYE"
WELCOME, ACK, DELIVER, PONG, ERROR = "WELCOME", "ACK", "DELIVER", "PONG", "ERROR"
CLIENT_COMMANDS = (HELLO, PUBLISH, COLLECT, PING, BYE)
BROKER_COMMANDS = (WELCOME, ACK, DELIVER, PONG, ERROR)

MAX_HEADER_BYTES = 1 << 20
MAX_TENSORS = 4096
MAX_NAME_CHARS = 256
MAX_NDIM = 8
DEFAULT_MAX_PAYLOAD_BYTES = 1 << 31
MAX_REF_FIELDS = 16
MAX_REF_CHARS = 256
"""A data-plane reference is a few scalars (PROTOCOL.md 10.2): the broker copies it into every
reader's DELIVER, so it is bounded here (a 1 MiB one made every reader's DELIVER unreadable)."""
MAX_UINT = (1 << 63) - 1
"""Largest seq or round: every integer field is checked against its range before anyone acts on it."""

# Dtypes a tensor may travel as. bfloat16 has no numpy type: it travels as the top
# 16 bits of float32 and is widened back on decode.
DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")
CODECS = ("raw", "bf16", "fp16")
_ITEMSIZE = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "bool": 1,
}
_FLOATS = ("float16", "bfloat16", "float32", "float64")


class WireError(ValueError):
    """A message that does not follow PROTOCOL.md. ``code`` is the ERROR code a broker replies with;
    ``seq`` is the refused request's sequence number when its header could be read that far."""

    def __init__(self, reason: str, code: str = "bad-message"):
        super().__init__(reason)
        self.code = code
        self.seq: int | None = None


_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxlist, _SHOW.maxdict = 2, 4, 4
_SHOW.maxstring, _SHOW.maxother, _SHOW.maxlong = 60, 60, 40


def _show(value: Any) -> str:
    """A short repr of a received value for an error reason: bounded in length and nesting, so
    a hostile header can neither bloat the reply nor exhaust the stack while we describe it."""
    return _SHOW.repr(value)


@dataclass
class TensorSpec:
    """How one tensor travels: its name, wire dtype, shape, byte count, and the dtype it is decoded to."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    decode_as: str

    def to_wire(self) -> dict:
        d = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "nbytes": self.nbytes}
        if self.decode_as != self.dtype:
            d["as"] = self.decode_as
        return d

    @property
    def schema_key(self) -> tuple:
        """What must stay the same for messages to be mixable: codec differences are allowed."""
        return (self.name, self.decode_as, self.shape)


@dataclass
class Message:
    """A decoded, validated message. ``frames`` are the payload frames, untouched (zero-copy)."""

    cmd: str
    header: dict
    frames: list = field(default_factory=list)
    specs: list[TensorSpec] = field(default_factory=list)
    header_bytes: int = 0
    """The length of the header frame as it came."""

    def __getitem__(self, key: str) -> Any:
        return self.header[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.header.get(key, default)


# ---------------------------------------------------------------- encoding


def encode(cmd: str, fields: Mapping[str, Any] | None = None, frames: Sequence = ()) -> list:
    """Header plus payload frames, ready for ``send_multipart(copy=False)``."""
    header = {"v": PROTOCOL_VERSION, "cmd": cmd}
    if fields:
        header.update(fields)
    return [msgpack.packb(header, use_bin_type=True), *frames]


CODEC_MAX = {"fp16": 65504.0, "bf16": 3.3895313892515355e38}
"""The largest finite value each codec carries; a finite value beyond it would arrive as infinity."""


def codec_overflow(name: str, codec: str, peak: float) -> ValueError:
    """Why a tensor was refused, rather than saturated: a receiver drops a letter with infinities,
    so the sender must hear why its parameters went nowhere, and silently clipped weights would be
    wrong weights. Only values finite before conversion count (a sender that skips its finite
    check may send infinity itself); ``peak`` is the largest of them."""
    return ValueError(
        f"tensor {name!r} holds {peak:.6g}, beyond the largest value {codec} can carry "
        f"({CODEC_MAX[codec]:.6g}); publish it with codec='raw' (--codec raw)"
    )


def _refuse_overflow(name: str, codec: str, inf: np.ndarray, original: np.ndarray) -> None:
    """Raise codec_overflow where ``inf`` (the infinities after conversion) marks a value that was finite."""
    if not inf.any():
        return
    overflow = inf & np.isfinite(original)
    if overflow.any():
        raise codec_overflow(name, codec, float(abs(original[overflow]).max()))


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, round to nearest even; NaN stays NaN. In-place passes: this is hot."""
    bits = np.asarray(x, dtype=np.float32)
    bits = (bits if bits.flags.c_contiguous else bits.copy(order="C")).view(np.uint32)
    acc = np.right_shift(bits, 16)
    np.bitwise_and(acc, 1, out=acc)
    np.add(acc, 0x7FFF, out=acc)
    np.add(acc, bits, out=acc)
    np.right_shift(acc, 16, out=acc)
    out = acc.astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def encode_array(name: str, value: Any, codec: str) -> tuple[np.ndarray, str, str]:
    """One array as it travels under ``codec``: (contiguous array of its wire bytes, wire dtype,
    dtype it decodes to). A contiguous array that needs no conversion is returned as is, not copied."""
    arr = np.asarray(value)
    if not arr.flags.c_contiguous:  # (ascontiguousarray would turn 0-d into 1-d)
        arr = arr.copy(order="C")
    orig = arr.dtype.name
    if orig not in _ITEMSIZE or orig == "bfloat16":
        raise ValueError(f"tensor {name!r} has dtype {orig}; valid: {', '.join(d for d in DTYPES if d != 'bfloat16')}")
    wire = orig
    if orig in _FLOATS and codec == "bf16":
        source, arr, wire = arr, _bf16_bits(arr), "bfloat16"
        _refuse_overflow(name, codec, (arr & 0x7FFF) == 0x7F80, source)
    elif orig in _FLOATS and codec == "fp16":
        with np.errstate(over="ignore"):  # refused just below, with a clearer word than numpy's
            source, arr, wire = arr, arr.astype(np.float16), "float16"
        _refuse_overflow(name, codec, np.isinf(arr), source)
    return arr, wire, orig


def pack_tensors(
    tensors: Mapping[str, Any],
    codec: str = "raw",
    convert: Callable[[str, Any, str], tuple[np.ndarray, str, str]] = encode_array,
) -> tuple[list[dict], list]:
    """Tensor schema (header part) and payload buffers for a dict of numpy arrays.

    ``convert`` turns one value into what travels, as encode_array does for numpy arrays;
    ``gossiprl.comms.tensors.pack`` passes one that takes other libraries' tensors as well.
    Contiguous data that needs no conversion is not copied: the buffer handed back points at
    the array's memory, so the caller must not modify it until the send has completed
    (GossipClient guarantees this by waiting for the broker's ACK).
    """
    if codec not in CODECS:
        raise ValueError(f"unknown codec {codec!r}; valid: {', '.join(CODECS)}")
    if not isinstance(tensors, Mapping) or not tensors:
        raise ValueError("tensors must be a non-empty dict of name -> array/tensor")
    if len(tensors) > MAX_TENSORS:
        raise ValueError(f"{len(tensors)} tensors in one message; at most {MAX_TENSORS}")
    schema, buffers = [], []
    for name, value in tensors.items():
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS:
            raise ValueError(f"tensor names must be strings of 1..{MAX_NAME_CHARS} characters, got {name!r}")
        arr, wire, orig = convert(name, value, codec)
        if arr.ndim > MAX_NDIM:
            raise ValueError(f"tensor {name!r} has {arr.ndim} dimensions; at most {MAX_NDIM}")
        spec = TensorSpec(name, wire, tuple(arr.shape), arr.nbytes, orig)
        schema.append(spec.to_wire())
        buffers.append(arr.reshape(-1).view(np.uint8) if arr.size else b"")
    return schema, buffers


# ---------------------------------------------------------------- decoding


def _frame_len(frame) -> int:
    return len(frame.buffer) if hasattr(frame, "buffer") else len(frame)


def _frame_bytes(frame) -> bytes | memoryview:
    return frame.buffer if hasattr(frame, "buffer") else frame


def _need(header: dict, key: str, kind: type | tuple, cmd: str) -> Any:
    value = header.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise WireError(f"{cmd} needs field {key!r} of type {names}, got {_show(value)}")
    return value


def _need_int(header: dict, key: str, cmd: str, low: int, high: int = MAX_UINT, optional: bool = False) -> None:
    """An int field in its range (bool is not an int on the wire); nil allowed when ``optional``."""
    value = header.get(key)
    if optional and value is None:
        return
    if type(value) is not int or not low <= value <= high:
        raise WireError(
            f"{cmd} needs field {key!r}: an int from {low} to {high}{' or nil' if optional else ''}, got {_show(value)}"
        )


def _valid_seq(header: dict) -> int | None:
    seq = header.get("seq")
    return seq if type(seq) is int and 0 <= seq <= MAX_UINT else None


def parse_specs(raw: Any, max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES) -> list[TensorSpec]:
    """Validate a tensor schema taken from a header: names, dtypes, shapes and sizes must agree."""
    if not isinstance(raw, list) or len(raw) > MAX_TENSORS:
        raise WireError(f"tensor schema must be a list of at most {MAX_TENSORS} entries")
    specs, names, total = [], set(), 0
    for entry in raw:
        if not isinstance(entry, dict):
            raise WireError("each tensor schema entry must be a map with name, dtype, shape, nbytes")
        name, dtype, shape, nbytes = (entry.get(k) for k in ("name", "dtype", "shape", "nbytes"))
        decode_as = entry.get("as", dtype)
        if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS or name in names:
            raise WireError(f"tensor name must be a unique string of 1..{MAX_NAME_CHARS} characters, got {_show(name)}")
        if not (
            isinstance(dtype, str) and dtype in _ITEMSIZE and isinstance(decode_as, str) and decode_as in _ITEMSIZE
        ):
            raise WireError(
                f"tensor {name!r}: dtype {_show(dtype)}/{_show(decode_as)} not allowed; valid: {', '.join(DTYPES)}",
                "bad-dtype",
            )
        if (dtype != decode_as) and not (dtype in _FLOATS and decode_as in _FLOATS):
            raise WireError(
                f"tensor {name!r}: only floats may be compressed; {decode_as} cannot travel as {dtype}", "bad-dtype"
            )
        if (
            not isinstance(shape, list)
            or len(shape) > MAX_NDIM
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)
        ):
            raise WireError(f"tensor {name!r}: shape must be a list of at most {MAX_NDIM} non-negative ints")
        expected = math.prod(shape) * _ITEMSIZE[dtype]
        if not isinstance(nbytes, int) or nbytes != expected:
            raise WireError(f"tensor {name!r}: nbytes {_show(nbytes)} != prod(shape) x itemsize = {expected}")
        total += nbytes
        if total > max_payload:
            raise WireError(f"payload exceeds the {max_payload}-byte limit", "too-large")
        names.add(name)
        specs.append(TensorSpec(name, dtype, tuple(shape), nbytes, decode_as))
    return specs


def check_ref(ref: Any, where: str) -> None:
    """A ``ref`` must be a small map of scalars; raise WireError saying so otherwise."""
    if (
        not isinstance(ref, dict)
        or len(ref) > MAX_REF_FIELDS
        or not all(
            isinstance(k, str)
            and len(k) <= MAX_REF_CHARS
            and (type(v) in (int, bool) or isinstance(v, str) and len(v) <= MAX_REF_CHARS)
            for k, v in ref.items()
        )
    ):
        raise WireError(
            f"{where} 'ref' must be a map of at most {MAX_REF_FIELDS} fields, each an int, a bool or a "
            f"string of at most {MAX_REF_CHARS} characters (PROTOCOL.md section 10.2)"
        )


def _check_frames(specs: list[TensorSpec], frames: Sequence, what: str) -> None:
    if len(frames) != len(specs):
        raise WireError(f"{what}: schema lists {len(specs)} tensors but {len(frames)} payload frames came")
    for spec, frame in zip(specs, frames):
        if _frame_len(frame) != spec.nbytes:
            raise WireError(
                f"{what}: tensor {spec.name!r} declares {spec.nbytes} bytes, its frame has {_frame_len(frame)}"
            )


def decode(
    frames: Sequence, max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES, max_header: int = MAX_HEADER_BYTES
) -> Message:
    """Parse and validate one message. Raises WireError, never anything else, on bad input.
    ``max_header``: a client raises it for DELIVER, whose header carries one schema per letter."""
    msg = decode_header(frames, max_payload, max_header)
    if msg.cmd == PUBLISH:
        decode_payload(msg, max_payload)
    return msg


def decode_payload(msg: Message, max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES) -> None:
    """Check a PUBLISH's tensor schema against its frames: the costly part of decoding, so a broker
    does it only once it knows the sender is registered."""
    try:
        msg.specs = parse_specs(msg.header.get("tensors"), max_payload)
        if not msg.specs:
            raise WireError("PUBLISH carries no tensors")
        if not ("ref" in msg.header and not msg.frames):  # a data-plane letter may leave its bytes at home
            _check_frames(msg.specs, msg.frames, msg.cmd)
    except WireError as err:
        err.seq = _valid_seq(msg.header)
        raise


def decode_header(
    frames: Sequence, max_payload: int = DEFAULT_MAX_PAYLOAD_BYTES, max_header: int = MAX_HEADER_BYTES
) -> Message:
    """Parse and validate everything but a PUBLISH's tensor schema (see decode_payload)."""
    if not frames:
        raise WireError("empty message")
    head = _frame_bytes(frames[0])
    if len(head) > max_header:
        raise WireError(f"header of {len(head)} bytes exceeds {max_header}", "too-large")
    try:
        header = msgpack.unpackb(
            head,
            raw=False,
            strict_map_key=True,
            max_str_len=MAX_HEADER_BYTES,
            max_bin_len=0,
            max_array_len=65536,
            max_map_len=MAX_TENSORS,
        )
    except Exception as exc:  # msgpack raises many types on garbage; all mean the same here
        raise WireError(
            f"header is not a GRP msgpack map: invalid msgpack, a bin value, or over a size limit "
            f"({type(exc).__name__})"
        ) from None
    if not isinstance(header, dict):
        raise WireError("header must be a msgpack map")
    try:
        return _validate(header, frames, max_payload)
    except WireError as err:
        err.seq = _valid_seq(header)
        raise


def _validate(header: dict, frames: Sequence, max_payload: int) -> Message:
    version = header.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:  # True == 1 in Python, not on the wire
        raise WireError(
            f"protocol version {_show(version)} not supported; this peer speaks {PROTOCOL_VERSION}", "version"
        )
    cmd = header.get("cmd")
    if not isinstance(cmd, str) or (cmd not in CLIENT_COMMANDS and cmd not in BROKER_COMMANDS):
        raise WireError(
            f"unknown command {_show(cmd)}; valid requests: {', '.join(CLIENT_COMMANDS)}; "
            f"replies: {', '.join(BROKER_COMMANDS)}",
            "unknown-command",
        )
    msg = Message(cmd, header, list(frames[1:]), header_bytes=_frame_len(frames[0]))
    # seq is nil only in an ERROR about a request that could not be read, and optional on HELLO, PING, BYE
    _need_int(header, "seq", cmd, 0, optional=cmd not in (PUBLISH, COLLECT))
    if cmd == HELLO:
        _need(header, "rank", int, cmd)
        _need_int(header, "n", cmd, 0, optional=True)
        for key, kind in (("topology", str), ("takeover", bool)):
            if header.get(key) is not None:
                _need(header, key, kind, cmd)
    if cmd in (PUBLISH, COLLECT):
        _need_int(header, "round", cmd, 0)
    if cmd == PUBLISH and "ref" in header:
        check_ref(header["ref"], "PUBLISH")
    if cmd == COLLECT and "unreachable" in header:
        ranks = header["unreachable"]
        if (
            not isinstance(ranks, list)
            or len(ranks) > MAX_TENSORS
            or not all(type(r) is int and 0 <= r <= MAX_UINT for r in ranks)
        ):
            raise WireError("COLLECT 'unreachable' must be a list of ranks (non-negative integers)")
    if cmd == DELIVER:
        letters = header.get("messages")
        if not isinstance(letters, list):
            raise WireError("DELIVER needs a 'messages' list")
        for letter in letters:
            if not isinstance(letter, dict) or not isinstance(letter.get("rank"), int):
                raise WireError("each DELIVER entry needs an int 'rank'")
            try:
                letter["specs"] = parse_specs(letter.get("tensors"), max_payload)
                if "ref" in letter:
                    check_ref(letter["ref"], "a DELIVER entry's")
            except WireError as err:
                if _carries_frames(letter):  # where its frames end is unknown: nothing after it can be read
                    raise
                letter["refused"], letter["specs"] = str(err), []  # a reference alone: drop that letter only
            if _carries_frames(letter):
                msg.specs.extend(letter["specs"])
        weights = header.get("weights")
        if not isinstance(weights, list) or not all(
            isinstance(p, list) and len(p) == 2 and type(p[0]) is int and type(p[1]) in (int, float) for p in weights
        ):
            raise WireError("DELIVER needs 'weights': a list of [rank, weight] pairs")
        if len(msg.frames) != len(msg.specs):
            raise WireError(f"DELIVER: schema lists {len(msg.specs)} tensors but {len(msg.frames)} frames came")
        _check_frames(msg.specs, msg.frames, cmd)
    elif msg.frames and cmd != PUBLISH:  # a PUBLISH's frames are checked by decode_payload
        raise WireError(f"{cmd} carries no payload frames, got {len(msg.frames)}")
    return msg


def _carries_frames(letter: dict) -> bool:
    """A DELIVER entry has payload frames unless it is a data-plane reference the broker did not relay."""
    return "ref" not in letter or letter.get("relayed") is True


def unpack_tensors(specs: Sequence[TensorSpec], frames: Sequence) -> dict[str, np.ndarray]:
    """Read-only numpy arrays for validated frames: views where the dtype allows, else widened copies."""
    out = {}
    for spec, frame in zip(specs, frames):
        buf = _frame_bytes(frame)
        if spec.dtype == "bfloat16":
            bits = np.frombuffer(buf, dtype=np.uint16).astype(np.uint32) << 16
            arr = bits.view(np.float32)  # numpy has no bfloat16: it arrives widened
            if spec.decode_as != "bfloat16":
                arr = arr.astype(spec.decode_as, copy=False)
        else:
            arr = np.frombuffer(buf, dtype=spec.dtype)
            if spec.decode_as != spec.dtype:
                arr = arr.astype(spec.decode_as)
        arr = arr.reshape(spec.shape)
        arr.flags.writeable = False
        out[spec.name] = arr
    return out


def deliveries(msg: Message) -> dict[int, dict[str, np.ndarray]]:
    """Split a DELIVER message into {peer rank: {name: array}} without copying (references left out)."""
    out, start = {}, 0
    for letter in msg.header["messages"]:
        if not _carries_frames(letter):
            continue
        specs = letter["specs"]
        out[letter["rank"]] = unpack_tensors(specs, msg.frames[start : start + len(specs)])
        start += len(specs)
    return out
