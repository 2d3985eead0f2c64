"""The torch adapter: tensors reach the numpy-only comms layer through gossiprl.comms.tensors alone."""

import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from gossiprl.comms import tensors, wire

torch = pytest.importorskip("torch")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible to torch on this host")
COMMS = Path(wire.__file__).parent


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


def test_finite_and_floating_alike_for_tensors_and_arrays():
    for make in (torch.tensor, np.array):
        assert tensors.finite(make([1.0, 2.0])) and tensors.finite(make([1, 2]))
        assert not tensors.finite(make([1.0, float("nan")])) and not tensors.finite(make([float("-inf")]))
        assert tensors.is_floating(make([1.0])) and not tensors.is_floating(make([1]))
    assert tensors.dtype_name(torch.zeros(1, dtype=torch.bfloat16)) == "bfloat16"
    assert tensors.dtype_name(np.zeros(1, np.int16)) == "int16"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_finite_sees_every_bad_value_in_every_float_tensor_layout(dtype):
    """finite reads CPU tensors through numpy views: strided, grad-carrying and numpy-less dtypes alike."""
    weight = torch.nn.Parameter(torch.ones(6, 4, dtype=dtype))
    assert tensors.finite(weight) and tensors.finite(weight.data.t()) and tensors.finite(weight.data[:, ::2])
    for bad in (float("nan"), float("inf"), float("-inf")):
        t = torch.ones(6, 4, dtype=dtype)
        t[5, 2] = bad
        assert not tensors.finite(t) and not tensors.finite(t.t()) and not tensors.finite(t[:, ::2])
        assert tensors.finite(t[:, 1::2])  # the view that skips the bad column


@pytest.mark.parametrize("dtype,slot", [(torch.float32, np.float32), (torch.bfloat16, np.uint16)])
def test_copy_into_a_slot_writes_the_tensors_bytes(dtype, slot):
    t = torch.randn(3, 4).to(dtype)
    dst = np.zeros((3, 4), slot)
    tensors.copy_into(dst, t)
    assert dst.tobytes() == t.view(torch.int16 if dtype == torch.bfloat16 else dtype).numpy().tobytes()


def test_flat_view_only_where_the_memory_is_writable_in_place():
    t = torch.zeros(2, 3)
    view = tensors.flat_view(t)
    view[4] = 7.0
    assert view.shape == (6,) and t[1, 1] == 7.0
    assert tensors.flat_view(t.to(torch.bfloat16)) is None
    assert tensors.flat_view(t.T) is None
    frozen = np.zeros(3)
    frozen.flags.writeable = False
    assert tensors.flat_view(frozen) is None


def test_as_torch_round_trip_onto_the_tensors_dtype():
    like = torch.zeros(4, dtype=torch.float64)
    letter = np.arange(4, dtype=np.float32)
    letter.flags.writeable = False  # as a received letter is
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        moved = tensors.as_torch(letter, like)
    assert moved.dtype == torch.float64 and moved.device == like.device
    np.testing.assert_array_equal(moved.numpy(), letter)
    tensors.assign(like, moved)
    np.testing.assert_array_equal(like.numpy(), letter)
    assert tensors.as_like(letter, np.zeros(4)) is letter


def test_norm_and_order_statistics_agree_for_tensors_and_arrays():
    rng = np.random.default_rng(0)
    values = [rng.standard_normal((3, 5)).astype(np.float32) for _ in range(4)]
    assert tensors.squared_norm(torch.from_numpy(values[0])) == pytest.approx(tensors.squared_norm(values[0]), rel=1e-6)
    np.testing.assert_array_equal(
        tensors.sorted_stack([torch.from_numpy(v) for v in values]).numpy(), tensors.sorted_stack(values)
    )


def test_named_tensors_of_a_module_are_its_parameters_data():
    layer = torch.nn.Linear(2, 3)
    named = tensors.named_tensors(layer)
    assert named.keys() == {"weight", "bias"} and not named["weight"].requires_grad
    with pytest.raises(TypeError, match="torch module, got list"):
        tensors.named_tensors([1.0])


@cuda
def test_a_cuda_tensor_is_staged_through_one_reused_pinned_buffer():
    stager = tensors.CudaStager()
    t = torch.randn(100, device="cuda")
    first, _, _ = tensors.encode("t", t, "raw", stager)
    np.testing.assert_array_equal(first, t.cpu().numpy())
    second, _, _ = tensors.encode("t", t * 2, "raw", stager)
    assert np.shares_memory(first, second)
    np.testing.assert_array_equal(roundtrip({"t": t}, "bf16")["t"], t.to(torch.bfloat16).float().cpu().numpy())


@cuda
def test_cuda_tensors_reach_a_slot_and_come_back_onto_the_device():
    t = torch.randn(8, device="cuda")
    dst = np.zeros(8, np.float32)
    tensors.copy_into(dst, t)
    np.testing.assert_array_equal(dst, t.cpu().numpy())
    assert tensors.flat_view(t) is None
    back = tensors.as_torch(dst, t)
    assert back.is_cuda and torch.equal(back, t)


def test_no_comms_module_but_tensors_has_a_torch_code_path():
    """The adapter is the one module that touches torch; wire does not even name it."""
    assert "torch" not in (COMMS / "wire.py").read_text()
    torch_code = re.compile(
        r"sys\.modules\[.torch.\]|^\s*(import|from) torch\b|\bis_torch\(|\.is_cuda\b|\.is_floating_point\(",
        re.MULTILINE,
    )
    touching = sorted(p.name for p in COMMS.glob("*.py") if torch_code.search(p.read_text()))
    assert touching == ["tensors.py"]
