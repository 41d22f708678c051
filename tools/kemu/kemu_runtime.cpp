/*
 * kemu_runtime.cpp: the SIMT runtime of the kemu emulator (tools/kemu), on
 * which a CUDA kernel rewritten by kemu_transform.py runs on the CPU.
 *
 * Every thread of a block is a std::thread, so __syncthreads is a real
 * barrier and a missing one shows as a stale or NaN read rather than being
 * hidden by sequential execution. Warp collectives (mma.sync, ldmatrix,
 * shuffles) meet at a per-warp barrier, publish their operands, and each
 * lane decodes its result from the PTX ISA's fragment tables. Blocks run one
 * after another on the same threads.
 *
 * The checks abort with one line on stderr, so ASan's report (or the abort)
 * shows where the kernel broke a rule the device would have faulted on or
 * silently mis-computed: misaligned or out-of-shared-memory ldmatrix and
 * cp.async, uncommitted cp.async groups, launch configurations beyond the
 * device's limits, dynamic shared memory beyond the opted-in attribute.
 */
#include "kemu_shim.h"
#include "sdpa.h"
#include "xgemm.h"
#include <stdarg.h>

thread_local dim3 threadIdx, blockIdx, gridDim, blockDim;
thread_local void *kemu_smem;
size_t kemu_smem_optin;
/* the size of the running launch's dynamic shared memory */
static size_t kemu_smem_size;

static bool kemu_in_smem(const void *p, size_t n)
{
	const char *base = (const char *)kemu_smem;
	return (const char *)p >= base && (const char *)p + n <= base + kemu_smem_size;
}

static void kemu_fail(const char *what)
{
	fprintf(stderr, "kemu: %s\n", what);
	abort();
}

/* a reusable barrier for n threads; the generation count lets a thread that
 * leaves one round not be caught by the next */
struct kemu_barrier {
	std::mutex lock;
	std::condition_variable cv;
	int n, arrived = 0;
	unsigned generation = 0;

	explicit kemu_barrier(int n_) : n(n_) {}
	void wait()
	{
		std::unique_lock<std::mutex> held(lock);
		unsigned g = generation;
		if (++arrived == n) {
			arrived = 0;
			generation++;
			cv.notify_all();
			return;
		}
		cv.wait(held, [&] { return generation != g; });
	}
};

/*
 * One warp's exchange area. Each collective publishes its lanes' operands,
 * meets at the barrier, then reads the others'. Two slots alternate by the
 * collective's parity: a fast lane may publish the next collective's
 * operands while a slow one still reads this one's, but cannot get two
 * ahead, as the next barrier waits for the slow lane.
 */
struct kemu_warp {
	kemu_barrier bar{32};
	uint32_t a[2][32][4], b[2][32][2];
	float shfl[2][32];
	const void *row[2][32];
};

struct kemu_block {
	kemu_barrier bar;
	std::vector<kemu_warp> warps;
	explicit kemu_block(int threads) : bar(threads), warps((threads + 31) / 32) {}
};

static thread_local kemu_block *kemu_cur_block;
/* this thread's count of warp collectives, whose parity picks the slot */
static thread_local unsigned kemu_collectives;

static kemu_warp &kemu_my_warp(void)
{
	return kemu_cur_block->warps[threadIdx.x >> 5];
}

void __syncthreads(void)
{
	kemu_cur_block->bar.wait();
}

float __shfl_xor_sync(unsigned mask, float v, int lane_mask)
{
	int lane = threadIdx.x & 31, slot = kemu_collectives++ & 1;
	kemu_warp &w = kemu_my_warp();
	/* a partial mask would need per-lane participation, which no kernel uses */
	if (mask != 0xffffffffu)
		kemu_fail("__shfl_xor_sync with a partial mask");
	w.shfl[slot][lane] = v;
	w.bar.wait();
	return w.shfl[slot][lane ^ lane_mask];
}

static float kemu_bf16_half(uint32_t reg, int half)
{
	__nv_bfloat16 h = {(uint16_t)(reg >> (16 * half))};
	return __bfloat162float(h);
}

/*
 * mma.sync.m16n8k16.row.col f32.bf16.bf16.f32, per the PTX ISA's fragment
 * tables: with group g = lane / 4 and t = lane % 4, lane l holds A's
 * (row g [+8], columns 2t, 2t+1 [+8]) in a[0..3] (rows +8 in a[1], a[3];
 * columns +8 in a[2], a[3]), B's (rows 2t, 2t+1 [+8], column g) in b[0..1],
 * and C's (row g [+8], columns 2t, 2t+1) in c[0..3]. Products are summed in
 * float in k order; the tensor core's internal order and precision are not
 * modelled (README.md).
 */
void kemu_mma(float c[4], const uint32_t a[4], const uint32_t b[2])
{
	int lane = threadIdx.x & 31, slot = kemu_collectives++ & 1;
	int g = lane >> 2, t = lane & 3;
	kemu_warp &w = kemu_my_warp();
	memcpy(w.a[slot][lane], a, 16);
	memcpy(w.b[slot][lane], b, 8);
	w.bar.wait();
	for (int r = 0; r < 4; r++) {
		int m = g + 8 * (r >= 2), n = 2 * t + (r & 1);
		float sum = c[r];
		for (int k = 0; k < 16; k++) {
			int a_lane = (m % 8) * 4 + (k % 8) / 2, a_reg = (m >= 8) + 2 * (k >= 8);
			int b_lane = n * 4 + (k % 8) / 2, b_reg = k >= 8;
			float av = kemu_bf16_half(w.a[slot][a_lane][a_reg], k % 2);
			float bv = kemu_bf16_half(w.b[slot][b_lane][b_reg], k % 2);
			sum += av * bv;
		}
		c[r] = sum;
	}
}

/*
 * ldmatrix.m8n8.x4 (.trans when trans): lane l gives the address of row
 * l % 8 of matrix l / 8, 16 bytes each, which must be aligned and in shared
 * memory; lane l receives of matrix i row l / 4, elements 2 (l % 4), +1
 * (transposed: column l / 4, rows 2 (l % 4), +1).
 */
void kemu_ldmatrix(uint32_t r[4], const void *row, int trans)
{
	int lane = threadIdx.x & 31, slot = kemu_collectives++ & 1;
	int g = lane >> 2, t = lane & 3;
	kemu_warp &w = kemu_my_warp();
	if ((uintptr_t)row & 15)
		kemu_fail("ldmatrix: row address not 16-byte aligned");
	if (!kemu_in_smem(row, 16))
		kemu_fail("ldmatrix: row address outside shared memory");
	w.row[slot][lane] = row;
	w.bar.wait();
	for (int i = 0; i < 4; i++) {
		uint16_t e[2];
		for (int k = 0; k < 2; k++) {
			const uint16_t *src;
			int col;
			if (!trans) {
				src = (const uint16_t *)w.row[slot][8 * i + g];
				col = 2 * t + k;
			} else {
				src = (const uint16_t *)w.row[slot][8 * i + 2 * t + k];
				col = g;
			}
			e[k] = src[col];
		}
		r[i] = (uint32_t)e[0] | ((uint32_t)e[1] << 16);
	}
}

/*
 * cp.async: a thread's copies are queued and land as late as the PTX rules
 * allow, at the wait_group that must see them, so a stage read before its
 * wait sees the stage's old contents (or the NaN poison) and a wrong
 * cp_wait<N> shows in the results. KEMU_CP_EAGER=1 takes the other extreme,
 * every copy landing at once, which finds a stage overwritten while another
 * warp still reads it.
 */
struct kemu_copy {
	void *dst;
	const void *src;
	int size, n;
};
/* committed groups, oldest first, and the group being built */
static thread_local std::vector<std::vector<kemu_copy>> kemu_cp_groups;
static thread_local std::vector<kemu_copy> kemu_cp_open;

/* n < size source bytes zero-fill the rest, as cp.async's src-size does */
static void kemu_cp_land(const kemu_copy &c)
{
	memset(c.dst, 0, c.size);
	if (c.n)
		memcpy(c.dst, c.src, c.n); /* ASan checks the global read here */
}

void kemu_cp_async(void *dst, const void *src, int size, int n)
{
	static const bool eager = getenv("KEMU_CP_EAGER") != nullptr;
	if (((uintptr_t)dst | (uintptr_t)src) & (size - 1))
		kemu_fail("cp.async: address not aligned to the copy size");
	if (!kemu_in_smem(dst, size))
		kemu_fail("cp.async: destination outside shared memory");
	if (eager) {
		kemu_cp_land({dst, src, size, n});
		return;
	}
	kemu_cp_open.push_back({dst, src, size, n});
}

void kemu_cp_commit(void)
{
	kemu_cp_groups.push_back(kemu_cp_open);
	kemu_cp_open.clear();
}

void kemu_cp_wait(int n)
{
	while ((int)kemu_cp_groups.size() > n) {
		for (const kemu_copy &c : kemu_cp_groups.front())
			kemu_cp_land(c);
		kemu_cp_groups.erase(kemu_cp_groups.begin());
	}
}

/*
 * A launch: the block's threads are started once and run every block in
 * turn. Before each block thread 0 poisons the dynamic shared memory with
 * 0xff bytes (a NaN in bf16 and float), so a read of shared memory no
 * thread of this block wrote shows in the result.
 */
void kemu_launch(dim3 grid, dim3 block, size_t smem, std::function<void()> kernel)
{
	int threads = block.x * block.y * block.z;
	/* the kernels index threads by threadIdx.x alone */
	if (block.y != 1 || block.z != 1 || threads > 1024 || grid.y > 65535 ||
	    grid.z > 65535 || !grid.x || !grid.y || !grid.z)
		kemu_fail("launch configuration beyond the device's limits");
	if (smem > 49152 && smem > kemu_smem_optin) {
		fprintf(stderr, "kemu: launch with %zu bytes of shared memory, %zu opted in\n", smem,
			kemu_smem_optin);
		abort();
	}
	uint64_t blocks = (uint64_t)grid.x * grid.y * grid.z;
	kemu_block *shared_block = new kemu_block(threads);
	void *smem_buf = smem ? malloc(smem) : nullptr;
	kemu_smem_size = smem;
	std::vector<std::thread> pool;
	for (int i = 0; i < threads; i++)
		pool.emplace_back([&, i] {
			kemu_cur_block = shared_block;
			kemu_collectives = 0;
			kemu_cp_groups.clear();
			kemu_cp_open.clear();
			threadIdx = dim3(i);
			for (uint64_t bi = 0; bi < blocks; bi++) {
				if (i == 0 && smem_buf)
					memset(smem_buf, 0xff, smem);
				shared_block->bar.wait();
				blockIdx = dim3(bi % grid.x, (bi / grid.x) % grid.y,
						bi / ((uint64_t)grid.x * grid.y));
				kemu_smem = smem_buf;
				gridDim = grid;
				blockDim = block;
				kernel();
				if (!kemu_cp_open.empty())
					kemu_fail("cp.async copies never committed");
				/* a finished block's copies land before the next one's poison */
				kemu_cp_wait(0);
				shared_block->bar.wait();
			}
		});
	for (std::thread &t : pool)
		t.join();
	free(smem_buf);
	delete shared_block;
}

/*
 * The few libms and gpu.cu functions the kernel and its test call, without
 * linking libms (whose CUDA half needs a device): errors as the library
 * records them, device memory as host memory.
 */
extern "C" {
int ms_err_set(struct ms_err *err, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	if (err) {
		err->code = code;
		vsnprintf(err->msg, sizeof err->msg, fmt, ap);
	}
	va_end(ap);
	return code;
}

int ms_err_nomem(struct ms_err *err)
{
	return ms_err_set(err, MS_ENOMEM, "out of memory");
}

void *ms_calloc(size_t n, size_t size)
{
	return calloc(n, size);
}

void ms_free(void *p)
{
	free(p);
}

const char *ms_dtype_name(enum ms_dtype dtype)
{
	(void)dtype;
	return "dtype";
}

int ms_gpu_available(void)
{
	return 1;
}

int ms_gpu_describe(char *buf, size_t n, struct ms_err *err)
{
	(void)err;
	snprintf(buf, n, "kemu (CPU emulation)");
	return 0;
}

int ms_gpu_malloc(void **p, uint64_t n, struct ms_err *err)
{
	*p = malloc(n);
	return *p ? 0 : ms_err_nomem(err);
}

void ms_gpu_free(void *p)
{
	free(p);
}

int ms_gpu_memcpy(void *dst, const void *src, uint64_t n, struct ms_err *err)
{
	(void)err;
	memcpy(dst, src, n);
	return 0;
}

int ms_gpu_sync(struct ms_err *err)
{
	(void)err;
	return 0;
}

int ms_gpu_memset(void *dst, int byte, uint64_t n, struct ms_err *err)
{
	(void)err;
	memset(dst, byte, n);
	return 0;
}

/* cuDNN's attention (sdpa.h), which t_flash_gpu checks beside the flash
 * kernels: cuDNN's kernels are not emulated, so it "does not load" and
 * the test says its side was not checked; nor is the emulated device an
 * sm_90, where the test would require cuDNN */
uint64_t ms_sdpa_version(struct ms_err *err)
{
	ms_err_set(err, MS_ENODEV, "cuDNN: not under emulation");
	return 0;
}

int ms_sdpa_new(const struct ms_flash_shape *, struct ms_sdpa **out, struct ms_err *err)
{
	*out = NULL;
	return ms_err_set(err, MS_ENODEV, "cuDNN: not under emulation");
}

void ms_sdpa_free(struct ms_sdpa *)
{
}

uint64_t ms_sdpa_workspace_bytes(const struct ms_sdpa *)
{
	return 0;
}

int ms_sdpa_fwd(struct ms_sdpa *, const void *, const void *, const void *, void *, float *,
		void *, void *, struct ms_err *err)
{
	return ms_err_set(err, MS_ENODEV, "cuDNN: not under emulation");
}

int ms_sdpa_bwd(struct ms_sdpa *, const void *, const void *, const void *, const void *,
		const void *, const float *, void *, void *, void *, void *, void *,
		struct ms_err *err)
{
	return ms_err_set(err, MS_ENODEV, "cuDNN: not under emulation");
}

int ms_xgemm_device_ok(void)
{
	return 0;
}

/* the test's --bench compares against it; the emulated test never runs it */
int ms_gpu_nvfp4_dequantize(const uint8_t *, const uint8_t *, uint64_t, uint64_t, float,
			    enum ms_nvfp4_tscale_kind, enum ms_dtype, void *, struct ms_err *err)
{
	return ms_err_set(err, MS_EIO, "ms_gpu_nvfp4_dequantize: not under emulation");
}
}

int ms_gpu_cuda_err(struct ms_err *err, cudaError_t e, const char *what)
{
	return ms_err_set(err, MS_EIO, "cuda error %d in %s", e, what);
}
