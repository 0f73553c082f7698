"""Does jax call an XLA FFI record handler? See record_probe.cu (build line there). Argument: the
folder holding librecord_probe.so and record_probe.cubin."""
import ctypes, os, sys, time
import numpy as np
import jax, jax.numpy as jnp

here = sys.argv[1]
os.environ.setdefault("PROBE_CUBIN", os.path.join(here, "record_probe.cubin"))
lib = ctypes.cdll.LoadLibrary(os.path.join(here, "librecord_probe.so"))
lib.probe_counter.restype = ctypes.c_long
cap = lambda name: jax.ffi.pycapsule(getattr(lib, name))
print("jax", jax.__version__, jax.devices()[0].device_kind)
jax.ffi.register_ffi_target("probe_rec", {"execute": cap("ProbeExec"), "record": cap("ProbeRecord")}, platform="CUDA")
jax.ffi.register_ffi_target("probe_cap", {"execute": cap("ProbeExec")}, platform="CUDA")

def counters():
    return dict(exec=lib.probe_counter(0), create=lib.probe_counter(1), update=lib.probe_counter(2),
                capture=lib.probe_counter(3), rec_us=lib.probe_counter(4) / 1e3)

N = 1 << 16
CHAIN = int(os.environ.get("CHAIN", "20"))

def make(target):
    call = jax.ffi.ffi_call(target, (jax.ShapeDtypeStruct((N,), jnp.float32), jax.ShapeDtypeStruct((1,), jnp.float32)))
    @jax.jit
    def f(x):
        amaxes = []
        for _ in range(CHAIN):
            x, a = call(x)
            amaxes.append(a)
        return x, jnp.concatenate(amaxes)
    return f

rng = np.random.default_rng(0)
for target in ["probe_rec", "probe_cap"]:
    f = make(target)
    before = counters()
    ok = True
    for trial in range(3):
        x = rng.standard_normal(N).astype(np.float32) + trial
        y, am = f(x)
        y, am = np.asarray(y), np.asarray(am)
        ref_y = x + CHAIN
        ref_am = np.array([np.abs(x + k + 1).max() for k in range(CHAIN)], np.float32)
        good = np.allclose(y, ref_y, rtol=1e-6, atol=1e-5) and np.allclose(am, ref_am)
        ok &= good
        print(target, "trial", trial, "ok" if good else f"WRONG y maxdiff {np.abs(y-ref_y).max()} am {am[:3]} ref {ref_am[:3]}")
    after = counters()
    print(target, "counters after 3 calls:", {k: after[k] - before[k] for k in after})
    # timing: enqueue and wall per call
    xs = [jnp.asarray(rng.standard_normal(N).astype(np.float32)) for _ in range(4)]
    for _ in range(20):
        f(xs[0])[0].block_until_ready()
    for rep in range(3):
        enq = []
        t0 = time.perf_counter()
        outs = []
        for i in range(200):
            s = time.perf_counter()
            outs.append(f(xs[i % 4]))
            enq.append(time.perf_counter() - s)
        jax.block_until_ready(outs)
        wall = (time.perf_counter() - t0) / 200
        print(f"{target} rep {rep}: enqueue median {np.median(enq)*1e6:.1f} us, wall/call {wall*1e6:.1f} us "
              f"({CHAIN} ops/call)")
    c2 = counters()
    print(target, "counters total:", c2)
