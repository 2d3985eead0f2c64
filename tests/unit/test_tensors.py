"""The torch adapter: tensors reach the numpy-only comms layer through gossiprl.comms.tensors alone."""
import re

import numpy as np
import pytest

from gossiprl.comms import tensors, wire

torch = pytest.importorskip("torch")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible to torch on this host")


def roundtrip(values, codec="raw"):
    schema, buffers = tensors.pack(values, codec)
    frames = wire.encode(wire.PUBLISH, {"seq": 1, "round": 0, "tensors": schema}, buffers)
    msg = wire.decode([bytes(memoryview(f)) for f in frames])
    return wire.unpack_tensors(msg.specs, msg.frames)


def test_a_contiguous_float32_tensor_travels_without_a_copy():
    t = torch.arange(1000, dtype=torch.float32, requires_grad=True)
    arr, dtype, decode_as = tensors.encode("t", t, "raw")
    assert (dtype, decode_as) == ("float32", "float32")
    assert np.shares_memory(arr, t.detach().numpy())
    _, buffers = tensors.pack({"t": t})
    assert np.shares_memory(buffers[0], t.detach().numpy())


def test_a_strided_tensor_is_copied_whole():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).T
    np.testing.assert_array_equal(roundtrip({"t": t})["t"], t.numpy())


def test_torch_tensors_travel_and_decode_to_numpy():
    t = torch.randn(5, 7)
    out = roundtrip({"t": t, "b": t.to(torch.bfloat16)})
    np.testing.assert_array_equal(out["t"], t.numpy())
    np.testing.assert_array_equal(out["b"], t.to(torch.bfloat16).float().numpy())


@pytest.mark.parametrize("codec,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_codecs_convert_in_torch_and_match_numpy(codec, dtype):
    """The tensor is converted where it lives; the result is torch's rounding, which numpy's path matches."""
    t = torch.randn(64, 33)
    schema, _ = tensors.pack({"t": t, "i": torch.arange(5)}, codec)
    assert schema[0]["nbytes"] == t.numel() * 2 and schema[0]["as"] == "float32"
    assert schema[1]["dtype"] == "int64" and "as" not in schema[1]
    out = roundtrip({"t": t}, codec)["t"]
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, t.to(dtype).float().numpy())
    np.testing.assert_array_equal(out, roundtrip({"t": t.numpy()}, codec)["t"])


@pytest.mark.parametrize("codec,big,limit", [("fp16", 70000.0, "65504"), ("bf16", 3.4e38, "3.38953e+38")])
def test_codecs_refuse_finite_values_they_would_turn_into_infinity(codec, big, limit):
    t = torch.tensor([1.0, -big, 2.0])
    with pytest.raises(ValueError, match=rf"'w'.*{re.escape(f'{big:.6g}')}.*{codec}.*{re.escape(limit)}.*codec='raw'"):
        tensors.pack({"ok": torch.zeros(2), "w": t}, codec)


def test_codecs_pass_infinity_on():
    out = roundtrip({"x": torch.tensor([65504.0, float("inf")])}, "fp16")["x"]
    assert out[0] == 65504.0 and np.isposinf(out[1])


def test_a_dtype_the_wire_lacks_is_refused_naming_the_tensor():
    with pytest.raises(wire.WireError, match=r"'z' has dtype complex64; valid: .*bfloat16") as err:
        tensors.pack({"z": torch.zeros(2, dtype=torch.complex64)})
    assert err.value.code == "bad-dtype"


def test_finite_alike_for_tensors_and_arrays():
    for make in (torch.tensor, np.array):
        assert tensors.finite(make([1.0, 2.0])) and tensors.finite(make([1, 2]))
        assert not tensors.finite(make([1.0, float("nan")])) and not tensors.finite(make([float("-inf")]))
    assert tensors.dtype_name(torch.zeros(1, dtype=torch.bfloat16)) == "bfloat16"
    assert tensors.dtype_name(np.zeros(1, np.int16)) == "int16"


@pytest.mark.parametrize("dtype,slot", [(torch.float32, np.float32), (torch.bfloat16, np.uint16)])
def test_copy_into_a_slot_writes_the_tensors_bytes(dtype, slot):
    t = torch.randn(3, 4).to(dtype)
    dst = np.zeros((3, 4), slot)
    tensors.copy_into(dst, t)
    assert dst.tobytes() == t.view(torch.int16 if dtype == torch.bfloat16 else dtype).numpy().tobytes()


@cuda
def test_a_cuda_tensor_is_staged_through_one_reused_pinned_buffer():
    stager = tensors.CudaStager()
    t = torch.randn(100, device="cuda")
    first, _, _ = tensors.encode("t", t, "raw", stager)
    np.testing.assert_array_equal(first, t.cpu().numpy())
    second, _, _ = tensors.encode("t", t * 2, "raw", stager)
    assert np.shares_memory(first, second)
    np.testing.assert_array_equal(roundtrip({"t": t}, "bf16")["t"], t.to(torch.bfloat16).float().cpu().numpy())
