/*
 * decode_probe.cu: the NVFP4 decode (train.cu's k_decode, 16 codes a
 * thread step) at the trainer benchmark's shapes, a layer's experts at a
 * time: 64 experts' gate and up [768, 2048] and down [2048, 768] rowwise
 * (the forward's), then their columnwise [2048, 768] and [768, 2048] (the
 * backward's). Three ways to lay a warp's loads and stores, each
 * bit-compared with the first:
 *
 *   block     a thread a scale block (8 bytes of codes, 16 bf16): its two
 *             16-byte stores 32 bytes apart along the warp, half sectors
 *             an instruction (k_decode's)
 *   half      a warp 32 scale blocks, lane l half blocks l / 2 and
 *             16 + l / 2: each store instruction 512 adjacent bytes,
 *             each load 128 (tried, slower)
 *   shuffled  lane l loads block l (as block), then stores half blocks
 *             l / 2 and 16 + l / 2 (as half), taken by shuffles (tried,
 *             slower)
 *   block cs  block with streaming stores (st.global.cs: evict first)
 *   block x2  block with two scale blocks a thread step (i and i + the
 *             grid's width), both loads issued before either decode
 *   staged    a thread a scale block (as block) into shared memory, 256
 *             a block step, then written out 16 bytes a lane side by side
 *             (whole sectors an instruction, as half)
 *
 * next to what the memory allows: either grid writing the same bytes with
 * no loads or arithmetic (store only), cudaMemsetAsync of the output, and
 * a device-to-device copy of it. GPU time a call from CUDA events over 20
 * calls after 3; TB/s counts codes + scales read and bf16 written. Not
 * built by make:
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 -Ikernels -o decode_probe \
 *     tools/bench/decode_probe.cu
 *   ./decode_probe
 */
#include <cuda_bf16.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fp4.h"

#define PK(x) do { cudaError_t e_ = (x); if (e_) { printf("cuda %s line %d\n", cudaGetErrorString(e_), __LINE__); exit(1);} } while (0)

struct job {
	const uint8_t *pk, *sc;
	__nv_bfloat16 *out;
	uint32_t rows, cols;
	float tscale;
};

/* 8 codes (4 bytes, a byte's low nibble first) times f as 8 bf16 */
__device__ __forceinline__ uint4 dec8(uint32_t v, float f)
{
	uint32_t o[4];
#pragma unroll
	for (int k = 0; k < 4; k++) {
		__nv_bfloat162 h = __floats2bfloat162_rn(e2m1v((v >> (8 * k)) & 15) * f,
							 e2m1v((v >> (8 * k + 4)) & 15) * f);
		o[k] = *(uint32_t *)&h;
	}
	return make_uint4(o[0], o[1], o[2], o[3]);
}

/* a thread a scale block; STORE: the same stores, no loads or arithmetic */
template <bool STORE>
__global__ void k_block(const job *d)
{
	const job j = d[blockIdx.y];
	uint32_t ng = j.cols / 16, n = j.rows * ng;
	for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
		uint4 o0, o1;
		if (STORE) {
			o0 = o1 = make_uint4(i, i, i, i);
		} else {
			uint2 v = *(const uint2 *)(j.pk + 8 * (uint64_t)i);
			float f = e4m3v(j.sc[i]) * j.tscale;
			o0 = dec8(v.x, f);
			o1 = dec8(v.y, f);
		}
		uint4 *p = (uint4 *)(j.out + 16 * (uint64_t)i);
		p[0] = o0;
		p[1] = o1;
	}
}

/* a warp 32 scale blocks, a lane two half blocks */
template <bool STORE>
__global__ void k_half(const job *d)
{
	const job j = d[blockIdx.y];
	uint32_t ng = j.cols / 16, n = j.rows * ng, lane = threadIdx.x & 31, hb = lane & 1;
	for (uint32_t w0 = blockIdx.x * blockDim.x + threadIdx.x - lane; w0 < n;
	     w0 += gridDim.x * blockDim.x) {
#pragma unroll
		for (int h = 0; h < 2; h++) {
			uint32_t i = w0 + 16 * h + lane / 2;
			if (i >= n)
				break;
			uint4 o;
			if (STORE) {
				o = make_uint4(i, i, i, i);
			} else {
				uint32_t v = *(const uint32_t *)(j.pk + 8 * (uint64_t)i + 4 * hb);
				o = dec8(v, e4m3v(j.sc[i]) * j.tscale);
			}
			*(uint4 *)(j.out + 16 * (uint64_t)i + 8 * hb) = o;
		}
	}
}

/* lane l loads block l, decodes half blocks l / 2 and 16 + l / 2 */
__global__ void k_shuffled(const job *d)
{
	const job j = d[blockIdx.y];
	uint32_t ng = j.cols / 16, n = j.rows * ng, lane = threadIdx.x & 31, hb = lane & 1;
	for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i - lane < n;
	     i += gridDim.x * blockDim.x) {
		uint2 v = make_uint2(0, 0);
		float f = 0.0f;
		if (i < n) {
			v = *(const uint2 *)(j.pk + 8 * (uint64_t)i);
			f = e4m3v(j.sc[i]) * j.tscale;
		}
#pragma unroll
		for (int h = 0; h < 2; h++) {
			int src = 16 * h + lane / 2;
			uint32_t x = __shfl_sync(0xffffffffu, v.x, src);
			uint32_t y = __shfl_sync(0xffffffffu, v.y, src);
			float fs = __shfl_sync(0xffffffffu, f, src);
			uint32_t ib = i - lane + src;
			if (ib >= n)
				continue;
			*(uint4 *)(j.out + 16 * (uint64_t)ib + 8 * hb) = dec8(hb ? y : x, fs);
		}
	}
}

/* block with streaming stores */
__global__ void k_block_cs(const job *d)
{
	const job j = d[blockIdx.y];
	uint32_t ng = j.cols / 16, n = j.rows * ng;
	for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
		uint2 v = *(const uint2 *)(j.pk + 8 * (uint64_t)i);
		float f = e4m3v(j.sc[i]) * j.tscale;
		uint4 *p = (uint4 *)(j.out + 16 * (uint64_t)i);
		__stcs(p, dec8(v.x, f));
		__stcs(p + 1, dec8(v.y, f));
	}
}

/* block, two scale blocks a thread step, loads first */
__global__ void k_block_x2(const job *d)
{
	const job j = d[blockIdx.y];
	uint32_t ng = j.cols / 16, n = j.rows * ng, w = gridDim.x * blockDim.x;
	for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += 2 * w) {
		uint32_t i2 = i + w;
		uint2 v = *(const uint2 *)(j.pk + 8 * (uint64_t)i), v2 = make_uint2(0, 0);
		uint32_t s = j.sc[i], s2 = 0;
		if (i2 < n) {
			v2 = *(const uint2 *)(j.pk + 8 * (uint64_t)i2);
			s2 = j.sc[i2];
		}
		float f = e4m3v(s) * j.tscale;
		uint4 *p = (uint4 *)(j.out + 16 * (uint64_t)i);
		p[0] = dec8(v.x, f);
		p[1] = dec8(v.y, f);
		if (i2 < n) {
			float f2 = e4m3v(s2) * j.tscale;
			p = (uint4 *)(j.out + 16 * (uint64_t)i2);
			p[0] = dec8(v2.x, f2);
			p[1] = dec8(v2.y, f2);
		}
	}
}

/* a block 256 scale blocks a step through shared memory (blockDim 256):
 * decoded as block, written out as 16-byte lanes side by side */
__global__ void k_staged(const job *d)
{
	__shared__ uint4 st[512];
	const job j = d[blockIdx.y];
	uint32_t ng = j.cols / 16, n = j.rows * ng, t = threadIdx.x;
	for (uint32_t b0 = blockIdx.x * 256; b0 < n; b0 += gridDim.x * 256) {
		uint32_t i = b0 + t;
		if (i < n) {
			uint2 v = *(const uint2 *)(j.pk + 8 * (uint64_t)i);
			float f = e4m3v(j.sc[i]) * j.tscale;
			st[2 * t] = dec8(v.x, f);
			st[2 * t + 1] = dec8(v.y, f);
		}
		__syncthreads();
		/* the step's output is contiguous here (dense rows): 512 16-byte
		 * pieces, thread t pieces t and 256 + t */
#pragma unroll
		for (int h = 0; h < 2; h++) {
			uint32_t k = 256 * h + t;
			if (b0 + k / 2 < n)
				*(uint4 *)(j.out + 16 * (uint64_t)b0 + 8 * (uint64_t)k) = st[k];
		}
		__syncthreads();
	}
}

int main()
{
	const int E = 64;
	cudaEvent_t a, b;
	PK(cudaEventCreate(&a));
	PK(cudaEventCreate(&b));
	for (int side = 0; side < 2; side++) {
		/* rowwise: gate, up [768, 2048], down [2048, 768]; columnwise the
		 * transposes */
		uint32_t shp[3][2] = {{768, 2048}, {768, 2048}, {2048, 768}};
		std::vector<job> jobs;
		size_t codes = 0;
		for (int e = 0; e < E; e++)
			for (int p = 0; p < 3; p++) {
				uint32_t r = shp[p][side], c = shp[p][1 - side];
				jobs.push_back({nullptr, nullptr, nullptr, r, c, 0.0f});
				codes += (size_t)r * c;
			}
		uint8_t *pk, *sc;
		__nv_bfloat16 *out, *ref, *cp;
		PK(cudaMalloc(&pk, codes / 2));
		PK(cudaMalloc(&sc, codes / 16));
		PK(cudaMalloc(&out, codes * 2));
		PK(cudaMalloc(&ref, codes * 2));
		PK(cudaMalloc(&cp, codes * 2));
		{
			/* every byte value in the codes; scales every e4m3 but NaN,
			 * some negative; tensor scales of either sign */
			std::vector<uint8_t> h(codes / 2);
			uint32_t x = 12345;
			for (auto &v : h) {
				x = x * 1664525u + 1013904223u;
				v = x >> 24;
			}
			PK(cudaMemcpy(pk, h.data(), h.size(), cudaMemcpyHostToDevice));
			std::vector<uint8_t> s(codes / 16);
			for (auto &v : s) {
				x = x * 1664525u + 1013904223u;
				v = x >> 24;
				if ((v & 0x7f) == 0x7f)
					v ^= 1;
			}
			PK(cudaMemcpy(sc, s.data(), s.size(), cudaMemcpyHostToDevice));
		}
		size_t off = 0;
		for (size_t k = 0; k < jobs.size(); k++) {
			jobs[k].pk = pk + off / 2;
			jobs[k].sc = sc + off / 16;
			jobs[k].out = out + off;
			jobs[k].tscale = k % 7 == 3 ? -0.75f : 1.0f / 448 / (1 + k % 5);
			off += (size_t)jobs[k].rows * jobs[k].cols;
		}
		job *dj;
		PK(cudaMalloc(&dj, jobs.size() * sizeof(job)));
		PK(cudaMemcpy(dj, jobs.data(), jobs.size() * sizeof(job), cudaMemcpyHostToDevice));
		int nd = (int)jobs.size();
		double bytes = codes / 2.0 + codes / 16.0 + codes * 2.0;
		printf("%s: %d jobs, %.1f M codes, %.0f MB moved a call\n",
		       side ? "columnwise" : "rowwise", nd, codes / 1e6, bytes / 1e6);
		auto run = [&](const char *name, auto launch, bool check, double mb) {
			for (int i = 0; i < 3; i++)
				launch();
			PK(cudaGetLastError());
			PK(cudaEventRecord(a));
			for (int i = 0; i < 20; i++)
				launch();
			PK(cudaEventRecord(b));
			PK(cudaEventSynchronize(b));
			float ms;
			PK(cudaEventElapsedTime(&ms, a, b));
			ms /= 20;
			const char *same = "";
			if (check) {
				std::vector<uint16_t> x(codes), y(codes);
				PK(cudaMemcpy(x.data(), out, codes * 2, cudaMemcpyDeviceToHost));
				PK(cudaMemcpy(y.data(), ref, codes * 2, cudaMemcpyDeviceToHost));
				size_t bad = 0;
				for (size_t i = 0; i < codes; i++)
					bad += x[i] != y[i];
				same = bad ? "DIFFERS" : "same bits";
				if (bad)
					printf("  %zu of %zu values differ\n", bad, codes);
			}
			printf("  %-28s %7.4f ms  %5.2f TB/s  %s\n", name, ms, mb / ms / 1e9, same);
		};
		for (int blocks : {32, 64, 128}) {
			dim3 g(blocks, nd);
			char nm[64];
			snprintf(nm, sizeof nm, "block, %d blocks a job", blocks);
			run(nm, [&] { k_block<false><<<g, 256>>>(dj); }, false, bytes);
			PK(cudaMemcpy(ref, out, codes * 2, cudaMemcpyDeviceToDevice));
			snprintf(nm, sizeof nm, "half, %d", blocks);
			run(nm, [&] { k_half<false><<<g, 256>>>(dj); }, true, bytes);
			snprintf(nm, sizeof nm, "shuffled, %d", blocks);
			run(nm, [&] { k_shuffled<<<g, 256>>>(dj); }, true, bytes);
			snprintf(nm, sizeof nm, "block cs, %d", blocks);
			run(nm, [&] { k_block_cs<<<g, 256>>>(dj); }, true, bytes);
			snprintf(nm, sizeof nm, "block x2, %d", blocks);
			run(nm, [&] { k_block_x2<<<g, 256>>>(dj); }, true, bytes);
			snprintf(nm, sizeof nm, "staged, %d", blocks);
			run(nm, [&] { k_staged<<<g, 256>>>(dj); }, true, bytes);
			snprintf(nm, sizeof nm, "block, store only, %d", blocks);
			run(nm, [&] { k_block<true><<<g, 256>>>(dj); }, false, bytes);
			snprintf(nm, sizeof nm, "half, store only, %d", blocks);
			run(nm, [&] { k_half<true><<<g, 256>>>(dj); }, false, bytes);
		}
		run("cudaMemsetAsync (out only)", [&] { PK(cudaMemsetAsync(out, 1, codes * 2)); }, false,
		    codes * 2.0);
		run("copy out -> cp (read + write)", [&] {
			PK(cudaMemcpyAsync(cp, out, codes * 2, cudaMemcpyDeviceToDevice));
		}, false, codes * 4.0);
		PK(cudaFree(pk));
		PK(cudaFree(sc));
		PK(cudaFree(out));
		PK(cudaFree(ref));
		PK(cudaFree(cp));
		PK(cudaFree(dj));
	}
	return 0;
}
