"""Wire format: round trips without sockets, and refusal of everything malformed."""

import re

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from gossiprl.comms import wire

NUMPY_DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"]


def roundtrip(tensors, codec="raw"):
    schema, buffers = wire.pack_tensors(tensors, codec)
    frames = wire.encode(wire.PUBLISH, {"seq": 1, "round": 3, "tensors": schema}, buffers)
    frames = [bytes(memoryview(f)) for f in frames]  # what a socket would hand over
    msg = wire.decode(frames)
    assert msg.cmd == wire.PUBLISH and msg["round"] == 3
    return wire.unpack_tensors(msg.specs, msg.frames)


@settings(max_examples=60, deadline=None)
@given(
    arrays=st.dictionaries(
        st.text(min_size=1, max_size=12),
        hnp.arrays(st.sampled_from(NUMPY_DTYPES), hnp.array_shapes(min_dims=0, max_dims=4, max_side=5)),
        min_size=1,
        max_size=4,
    )
)
def test_raw_roundtrip_is_exact(arrays):
    out = roundtrip(arrays)
    assert out.keys() == arrays.keys()
    for name, a in arrays.items():
        assert out[name].dtype == a.dtype and out[name].shape == a.shape
        np.testing.assert_array_equal(out[name], a)
        assert not out[name].flags.writeable


def test_large_contiguous_array_is_not_copied_on_encode():
    x = np.arange(100_000, dtype=np.float32)
    _, buffers = wire.pack_tensors({"x": x})
    assert np.shares_memory(buffers[0], x)


def test_decoded_arrays_are_views_on_the_frames():
    x = np.arange(1000, dtype=np.float32)
    schema, buffers = wire.pack_tensors({"x": x})
    frames = wire.encode(wire.PUBLISH, {"seq": 1, "round": 0, "tensors": schema}, [bytearray(buffers[0])])
    msg = wire.decode(frames)
    out = wire.unpack_tensors(msg.specs, msg.frames)
    assert np.shares_memory(out["x"], np.frombuffer(frames[1], np.uint8))


@pytest.mark.parametrize("codec,tol", [("bf16", 2**-8), ("fp16", 2**-11)])
def test_compressed_codecs_halve_bytes_and_decode_to_float32(codec, tol):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 33)).astype(np.float32)
    ints = np.arange(10, dtype=np.int64)
    schema, buffers = wire.pack_tensors({"x": x, "i": ints}, codec)
    assert schema[0]["nbytes"] == x.nbytes // 2 and schema[0]["as"] == "float32"
    assert schema[1]["dtype"] == "int64" and "as" not in schema[1]
    out = roundtrip({"x": x, "i": ints}, codec)
    assert out["x"].dtype == np.float32
    np.testing.assert_allclose(out["x"], x, rtol=tol, atol=0)
    np.testing.assert_array_equal(out["i"], ints)


def test_bf16_rounds_to_nearest_even_and_keeps_specials():
    x = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, np.inf, -np.inf, np.nan, 0.0, -0.0], np.float32)
    out = roundtrip({"x": x}, "bf16")["x"]
    # 1+2^-8 is a tie between 1 and 1+2^-7: even mantissa (1.0) wins; 1+3*2^-8 rounds up to 1+2^-6.
    np.testing.assert_array_equal(out[:3], [1.0, 1.0, 1.0 + 2**-6])
    assert np.isposinf(out[3]) and np.isneginf(out[4]) and np.isnan(out[5])
    assert np.signbit(out[7]) and not np.signbit(out[6])


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize(
    "codec,big,limit", [("fp16", 70000.0, "65504"), ("bf16", 3.4e38, "3.38953e+38"), ("fp16", 1e30, "65504")]
)
def test_compressed_codecs_refuse_finite_values_they_would_turn_into_infinity(kind, codec, big, limit):
    """A receiver drops a letter holding infinity: the sender must hear why, naming the tensor and the limit."""
    x = np.array([1.0, -big, 2.0], np.float32)
    if kind == "torch":
        x = pytest.importorskip("torch").from_numpy(x)
    with pytest.raises(ValueError, match=rf"'w'.*{re.escape(f'{big:.6g}')}.*{codec}.*{re.escape(limit)}.*codec='raw'"):
        wire.pack_tensors({"w": x}, codec)


def test_compressed_codecs_still_carry_what_fits_and_pass_infinity_on():
    edge = np.array([65504.0, -65504.0, np.inf], np.float32)
    out = roundtrip({"x": edge}, "fp16")["x"]
    assert out[0] == 65504.0 and out[1] == -65504.0 and np.isposinf(out[2])


def test_pack_rejects_bad_input_with_clear_errors():
    with pytest.raises(ValueError, match="codec"):
        wire.pack_tensors({"x": np.zeros(1)}, "zip")
    with pytest.raises(ValueError, match="non-empty dict"):
        wire.pack_tensors({})
    with pytest.raises(ValueError, match="dtype complex128"):
        wire.pack_tensors({"x": np.zeros(2, complex)})
    with pytest.raises(ValueError, match="names"):
        wire.pack_tensors({"": np.zeros(2)})


def good_publish(**override):
    header = {
        "v": 1,
        "cmd": "PUBLISH",
        "seq": 1,
        "round": 0,
        "tensors": [{"name": "x", "dtype": "float32", "shape": [2, 2], "nbytes": 16}],
    }
    header.update(override)
    return [msgpack.packb(header), b"\0" * 16]


@pytest.mark.parametrize(
    "frames,code,words",
    [
        ([], "bad-message", "empty"),
        ([b"\xc1garbage"], "bad-message", "msgpack"),
        ([msgpack.packb([1, 2])], "bad-message", "map"),
        ([msgpack.packb({"v": 2, "cmd": "PING"})], "version", "speaks 1"),
        ([msgpack.packb({"cmd": "PING"})], "version", "None"),
        ([msgpack.packb({"v": 1, "cmd": "EVAL"})], "unknown-command", "valid"),
        ([msgpack.packb({"v": 1, "cmd": "HELLO", "rank": "3"})], "bad-message", "rank"),
        ([msgpack.packb({"v": 1, "cmd": "HELLO", "rank": True})], "bad-message", "rank"),
        ([msgpack.packb({"v": 1, "cmd": "PING", "seq": 1}), b"extra"], "bad-message", "no payload"),
        ([msgpack.packb({"v": 1, "cmd": "PING", "blob": b"bytes"})], "bad-message", "msgpack"),
        (good_publish()[:1], "bad-message", "1 tensors but 0"),
        (good_publish()[:1] + [b"\0" * 15], "bad-message", "15"),
        (good_publish(round=None), "bad-message", "round"),
        (good_publish(tensors=[]), "bad-message", "no tensors"),
        (good_publish(tensors="x"), "bad-message", "list"),
        (good_publish(tensors=[{"name": "x", "dtype": "object", "shape": [2], "nbytes": 16}]), "bad-dtype", "valid"),
        (
            good_publish(tensors=[{"name": "x", "dtype": "float32", "shape": [2, 2], "nbytes": 15}]),
            "bad-message",
            "prod",
        ),
        (
            good_publish(tensors=[{"name": "x", "dtype": "float32", "shape": [-4], "nbytes": 16}]),
            "bad-message",
            "shape",
        ),
        (
            good_publish(tensors=[{"name": "x", "dtype": "int32", "as": "float32", "shape": [4], "nbytes": 16}]),
            "bad-dtype",
            "only floats",
        ),
        (
            [
                msgpack.packb(
                    {
                        "v": 1,
                        "cmd": "PUBLISH",
                        "seq": 1,
                        "round": 0,
                        "tensors": [{"name": "x", "dtype": "uint8", "shape": [1 << 31], "nbytes": 1 << 31}],
                    }
                )
            ],
            "too-large",
            "limit",
        ),
    ],
)
def test_decode_refuses_malformed_messages(frames, code, words):
    with pytest.raises(wire.WireError, match=words) as err:
        wire.decode(frames, max_payload=1 << 30)
    assert err.value.code == code


WIRE_CODES = {"bad-message", "bad-dtype", "too-large", "version", "unknown-command"}
"""The ERROR codes (PROTOCOL.md section 4) that decoding alone can give; the rest need a broker's state."""


def assert_refusal_is_documented(err: wire.WireError) -> None:
    """A refusal a broker can send on as it is: a code of the protocol and a one-line reason."""
    assert err.code in WIRE_CODES, err.code
    assert str(err) and "\n" not in str(err)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), min_size=0, max_size=4))
def test_decode_of_random_bytes_is_refused_with_a_protocol_code_or_round_trips(frames):
    try:
        msg = wire.decode(frames)
    except wire.WireError as err:
        assert_refusal_is_documented(err)
        return
    fields = {k: v for k, v in msg.header.items() if k not in ("v", "cmd")}
    again = wire.decode(wire.encode(msg.cmd, fields, msg.frames))
    assert again.cmd == msg.cmd and again.frames == msg.frames and again.specs == msg.specs


header_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(
    cmd=st.sampled_from(wire.CLIENT_COMMANDS + wire.BROKER_COMMANDS + ("X",)),
    fields=st.dictionaries(
        st.sampled_from(["seq", "round", "rank", "tensors", "messages", "n"]), header_values, max_size=5
    ),
    payload=st.lists(st.binary(max_size=32), max_size=3),
)
def test_decode_of_structured_garbage_is_refused_with_a_protocol_code_or_kept_as_sent(cmd, fields, payload):
    frames = [msgpack.packb({"v": 1, "cmd": cmd, **fields}), *payload]
    try:
        msg = wire.decode(frames)
    except wire.WireError as err:
        assert_refusal_is_documented(err)
        if cmd == "X":
            assert err.code == "unknown-command"
        seq = fields.get("seq")
        if type(seq) is int and 0 <= seq <= wire.MAX_UINT:
            assert err.seq == seq, "a refusal of a header with a valid seq must echo it"
        return
    assert cmd != "X", "an unknown command was accepted"
    assert msg.cmd == cmd and msg.frames == payload
    assert msgpack.packb(msg.header) == frames[0], "the header was changed on the way in"


def test_the_comms_layer_imports_neither_torch_nor_gymnasium():
    """The layers below the agent must stay importable on a box with no RL stack (a broker host)."""
    import subprocess
    import sys

    code = (
        "import importlib, pkgutil, sys, topologies, gossiprl, gossiprl.comms, gossiprl.launch\n"
        "for m in pkgutil.iter_modules(gossiprl.comms.__path__): importlib.import_module('gossiprl.comms.' + m.name)\n"
        "print(sorted(m for m in ('torch', 'gymnasium', 'ale_py') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
