/*
 * sha256_tree.cu: the chunk hashes of a tree digest (hash.h, ms(5) "Tree
 * digests") computed on the GPU over bytes in device memory.
 *
 * What: ms_gpu_tree_chunks writes the SHA-256 of every 2^log2-byte chunk
 * of a device buffer (the last chunk short) to device memory, 32 bytes per
 * chunk, in order; ms_gpu_tree_digest folds them into the tree digest.
 *
 * Why this way: SHA-256 is sequential inside one message, so the
 * parallelism is across chunks: one thread hashes one chunk, start to
 * end (FIPS 180-4, the padding done in registers for the short last
 * block). With 64 KiB chunks a few thousand threads hash faster than PCIe
 * delivers bytes, which is what the verified load needs: the kernel runs on
 * the spans already copied while the next ones are in flight. Each thread
 * reads its chunk in 16-byte loads (chunks start 256-byte aligned in the
 * verified load's arena; a misaligned start falls back to byte loads). The
 * fold (a SHA-256 over 1/2048 of the bytes) is left to the caller: one GPU
 * thread would take milliseconds over a 2 GB tensor's chunk list, a CPU
 * core a fraction of one.
 *
 * Checked against: OpenSSL's SHA-256 of each chunk and hash.c's
 * ms_tree_digest on seeded random data of odd lengths (t_tree_gpu.c).
 */
#include "gpu_internal.h"

#include <string.h>

__constant__ uint32_t sha_k[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
	0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
	0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
	0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
	0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
	0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
	0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
	0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
	0xc67178f2,
};

__device__ __forceinline__ uint32_t rotr(uint32_t x, int n)
{
	return __funnelshift_r(x, x, n);
}

__device__ __forceinline__ uint32_t bswap(uint32_t x)
{
	return __byte_perm(x, 0, 0x0123);
}

/* One compression of the 16 big-endian words w into h. */
__device__ __forceinline__ void compress(uint32_t h[8], uint32_t w[16])
{
	uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6],
		 hh = h[7];

#pragma unroll
	for (int i = 0; i < 64; i++) {
		uint32_t wi;

		if (i < 16) {
			wi = w[i];
		} else {
			uint32_t w15 = w[(i + 1) & 15], w2 = w[(i + 14) & 15];
			uint32_t s0 = rotr(w15, 7) ^ rotr(w15, 18) ^ (w15 >> 3);
			uint32_t s1 = rotr(w2, 17) ^ rotr(w2, 19) ^ (w2 >> 10);

			wi = w[i & 15] + s0 + w[(i + 9) & 15] + s1;
			w[i & 15] = wi;
		}
		uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) +
			      sha_k[i] + wi;
		uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));

		hh = g;
		g = f;
		f = e;
		e = d + t1;
		d = c;
		c = b;
		b = a;
		a = t1 + t2;
	}
	h[0] += a;
	h[1] += b;
	h[2] += c;
	h[3] += d;
	h[4] += e;
	h[5] += f;
	h[6] += g;
	h[7] += hh;
}

/* Chunk c of the n bytes at data into out + 32 c. */
__device__ void hash_chunk(const uint8_t *__restrict__ data, uint64_t n, unsigned log2,
			   uint64_t c, uint8_t *__restrict__ out)
{
	const uint64_t start = c << log2;
	const uint64_t len = n - start < ((uint64_t)1 << log2) ? n - start : (uint64_t)1 << log2;
	const uint8_t *p = data + start;
	const uint64_t full = len / 64;
	uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
			 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
	uint32_t w[16];

	if (((uintptr_t)p & 15) == 0) {
		const uint4 *q = (const uint4 *)p;

		for (uint64_t b = 0; b < full; b++) {
#pragma unroll
			for (int k = 0; k < 4; k++) {
				uint4 v = __ldg(q + 4 * b + k);

				w[4 * k + 0] = bswap(v.x);
				w[4 * k + 1] = bswap(v.y);
				w[4 * k + 2] = bswap(v.z);
				w[4 * k + 3] = bswap(v.w);
			}
			compress(h, w);
		}
	} else {
		for (uint64_t b = 0; b < full; b++) {
#pragma unroll
			for (int k = 0; k < 16; k++) {
				const uint8_t *x = p + 64 * b + 4 * k;

				w[k] = (uint32_t)x[0] << 24 | (uint32_t)x[1] << 16 |
				       (uint32_t)x[2] << 8 | x[3];
			}
			compress(h, w);
		}
	}
	/* the tail: the rest of the bytes, 0x80, zeros, the bit length */
	{
		const uint64_t rest = len - full * 64, bits = len * 8;
		const uint8_t *x = p + full * 64;
		int blocks = rest < 56 ? 1 : 2;

		for (int blk = 0; blk < blocks; blk++) {
#pragma unroll
			for (int k = 0; k < 16; k++) {
				uint32_t word = 0;

				for (int j = 0; j < 4; j++) {
					uint64_t pos = (uint64_t)blk * 64 + 4 * k + j;
					uint32_t byte = pos < rest ? x[pos] : pos == rest ? 0x80 : 0;

					word = word << 8 | byte;
				}
				w[k] = word;
			}
			if (blk == blocks - 1) {
				w[14] = (uint32_t)(bits >> 32);
				w[15] = (uint32_t)bits;
			}
			compress(h, w);
		}
	}
	uint32_t *o = (uint32_t *)(out + c * 32);

#pragma unroll
	for (int k = 0; k < 8; k++)
		o[k] = bswap(h[k]);
}

__global__ void sha256_chunks_kernel(const uint8_t *__restrict__ data, uint64_t n,
				     unsigned log2, uint64_t nchunks, uint8_t *__restrict__ out)
{
	uint64_t c = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;

	if (c < nchunks)
		hash_chunk(data, n, log2, c, out);
}

/* Many buffers in one launch: thread c finds its buffer by the chunk
 * numbers the buffers start at (first, ascending; first[nseg] the total). */
__global__ void sha256_chunks_batch_kernel(const struct ms_gpu_tree_seg *__restrict__ seg,
					   const uint64_t *__restrict__ first, size_t nseg,
					   unsigned log2)
{
	uint64_t c = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t lo = 0, hi = nseg;

	if (c >= first[nseg])
		return;
	while (hi - lo > 1) {
		size_t mid = (lo + hi) / 2;

		if (first[mid] <= c)
			lo = mid;
		else
			hi = mid;
	}
	hash_chunk(seg[lo].data, seg[lo].n, log2, c - first[lo], seg[lo].out);
}

extern "C" int ms_gpu_tree_chunks(const void *data, uint64_t n, unsigned log2, uint8_t *out,
				  void *stream, struct ms_err *err)
{
	const uint64_t nchunks = ms_tree_nchunks(n, log2);
	const unsigned threads = 128;
	int rc = MS_OK;

	if (log2 < MS_TREE_LOG2_MIN || log2 > MS_TREE_LOG2_MAX)
		return ms_err_set(err, MS_EINVAL, "tree chunk size 2^%u out of range", log2);
	if (!nchunks)
		return MS_OK;
	if (nchunks / threads + 1 > 0x7fffffffu)
		return ms_err_set(err, MS_EINVAL, "too many chunks for one launch");
	sha256_chunks_kernel<<<(unsigned)((nchunks + threads - 1) / threads), threads, 0,
			       (cudaStream_t)stream>>>((const uint8_t *)data, n, log2, nchunks, out);
	CK(cudaGetLastError());
out:
	return rc;
}

extern "C" int ms_gpu_tree_chunks_batch(const struct ms_gpu_tree_seg *segs, size_t nseg,
					unsigned log2, struct ms_err *err)
{
	const unsigned threads = 128;
	uint64_t *first = NULL, total = 0;
	struct ms_gpu_tree_seg *dseg = NULL;
	uint64_t *dfirst = NULL;
	int rc = MS_OK;

	if (log2 < MS_TREE_LOG2_MIN || log2 > MS_TREE_LOG2_MAX)
		return ms_err_set(err, MS_EINVAL, "tree chunk size 2^%u out of range", log2);
	if (!nseg)
		return MS_OK;
	first = (uint64_t *)ms_malloc((nseg + 1) * sizeof(*first));
	if (!first)
		return ms_err_set(err, MS_ENOMEM, "out of memory");
	for (size_t i = 0; i < nseg; i++) {
		first[i] = total;
		total += ms_tree_nchunks(segs[i].n, log2);
	}
	first[nseg] = total;
	if (!total)
		goto out;
	if (total / threads + 1 > 0x7fffffffu) {
		rc = ms_err_set(err, MS_EINVAL, "too many chunks for one launch");
		goto out;
	}
	CK(cudaMalloc((void **)&dseg, nseg * sizeof(*dseg)));
	CK(cudaMalloc((void **)&dfirst, (nseg + 1) * sizeof(*dfirst)));
	CK(cudaMemcpy(dseg, segs, nseg * sizeof(*dseg), cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dfirst, first, (nseg + 1) * sizeof(*dfirst), cudaMemcpyHostToDevice));
	sha256_chunks_batch_kernel<<<(unsigned)((total + threads - 1) / threads), threads>>>(
		dseg, dfirst, nseg, log2);
	CK(cudaGetLastError());
	CK(cudaDeviceSynchronize());
out:
	cudaFree(dseg);
	cudaFree(dfirst);
	ms_free(first);
	return rc;
}

extern "C" int ms_gpu_tree_digest(const void *data, uint64_t n, unsigned log2,
				  uint8_t out[MS_SHA256_LEN], struct ms_err *err)
{
	const uint64_t nchunks = ms_tree_nchunks(n, log2);
	uint8_t *dch = NULL, *hch = NULL;
	int rc;

	if ((rc = ms_gpu_ready(err)) != MS_OK)
		return rc;
	hch = (uint8_t *)ms_malloc(nchunks ? nchunks * MS_SHA256_LEN : 1);
	if (!hch)
		return ms_err_set(err, MS_ENOMEM, "out of memory");
	CK(cudaMalloc((void **)&dch, nchunks ? nchunks * MS_SHA256_LEN : 1));
	if ((rc = ms_gpu_tree_chunks(data, n, log2, dch, NULL, err)) != MS_OK)
		goto out;
	CK(cudaMemcpy(hch, dch, nchunks * MS_SHA256_LEN, cudaMemcpyDeviceToHost));
	if ((rc = ms_tree_fold(log2, n, hch, out)) != MS_OK)
		ms_sha256_err(err, rc);
out:
	cudaFree(dch);
	ms_free(hch);
	return rc;
}
