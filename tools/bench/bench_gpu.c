/*
 * bench_gpu.c: the GPU codec and the verified load, timed on the device
 * (tools/bench/bench-gpu.sh builds and runs it; see there).
 *
 *   bench_gpu [--load-only] [--rows R] [--cols C] [--torch-ms MS] [--torch-check TEXT]
 *             [--vload-file F] [--torch-load-ms MS] [--out FILE]
 *             [--vload2-file F2]
 *   bench_gpu --make-vload F [--vload-mb MB] [--make-vload2 F2]
 *   bench_gpu --dump DIR
 *
 * Ceiling: cudaMemcpy device to device, counting bytes read plus written.
 * Each kernel: median of 15 runs after 3 warm-ups, timed with CUDA events
 * around the library call (which includes its small status copy), on a
 * bf16 [R, C] weight of normal random values; bandwidth is bytes read plus
 * bytes written over that time. Every timed configuration is first checked
 * against the CPU reference on a slice of rows (rows 0..255 of the source
 * and the matching rows of the rowwise output and columns of the
 * columnwise output, which depend on nothing else).
 *
 * Verified load: --make-vload writes a safetensors file of --vload-mb MB
 * in 16 MiB bf16 tensors (expert-sized); --vload-file F times loading it
 * after one read (warm page cache), each the median of 5 runs, device
 * allocation included: the same pipelined loader without hashing (pread
 * into pinned buffers, cudaMemcpyAsync, same threads and chunk size, every
 * tensor cut into the verified load's 16 MiB spans),
 * ms_load_verified_gpu, and a naive loader (cudaMemcpy from the mapping,
 * one tensor at a time); --torch-load-ms adds safetensors.torch.load_file
 * to the GPU as bench_torch.py timed it on the same file.
 *
 * Tree digests (hash.h): the chunk kernel timed over the weight; each
 * load also with the tensors' tree digests (use_tree: the chunks hashed in
 * device memory) and as a first load that makes them (want_tree); the host
 * loads with and without trees. --make-vload2 / --vload2-file: the same
 * on one 2 GiB tensor and 256 small ones, plus the 2 GiB tensor alone on
 * the host (tree on every thread against one sequential digest).
 *
 * --dump DIR writes a small case (input, amax, our four outputs) for
 * bench_torch.py --check. Results go to stdout and, as markdown, to --out.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

#include <cuda_runtime_api.h>

#include "common.h"
#include "gpu.h"
#include "hash.h"
#include "nvfp4.h"
#include "safetensors.h"
#include "vload.h"

#define WARM 3
#define REPS 15
#define SLICE 256

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint64_t next_rand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static float gauss(void)
{
	double v = 0;

	for (int k = 0; k < 4; k++)
		v += (double)(next_rand() >> 11) * 0x1p-53 - 0.5;
	return (float)(v * 1.7320508 * 0.02);
}

static void die(const char *what, const struct ms_err *err)
{
	fprintf(stderr, "bench_gpu: %s: %s\n", what, err ? err->msg : "failed");
	exit(3);
}

static void ck(cudaError_t e, const char *what)
{
	if (e != cudaSuccess) {
		fprintf(stderr, "bench_gpu: %s: %s\n", what, cudaGetErrorString(e));
		exit(3);
	}
}

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;

	return x < y ? -1 : x > y;
}

static float median(float *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_float);
	return v[n / 2];
}

/* ---- results -------------------------------------------------------------------- */

struct row {
	int vs_copy;   /* a device-memory kernel: compare with the copy */
	char name[96];
	char shape[48];
	double bytes;
	double ms;
	double gbs;
	char note[96];
};

static struct row rows_out[64];
static int nrows;
static double copy_gbs;

static struct row *add_row(const char *name, const char *shape, double bytes, double ms,
			   const char *note)
{
	struct row *r = &rows_out[nrows++];

	snprintf(r->name, sizeof(r->name), "%s", name);
	snprintf(r->shape, sizeof(r->shape), "%s", shape);
	r->bytes = bytes;
	r->ms = ms;
	r->gbs = bytes > 0 && ms > 0 ? bytes / (ms * 1e-3) / 1e9 : 0;
	r->vs_copy = strncmp(name, "load ", 5) && !strstr(name, "host memory");
	snprintf(r->note, sizeof(r->note), "%s", note ? note : "");
	printf("%-44s %-16s %10.3f ms %9.1f GB/s %6.1f%%  %s\n", r->name, r->shape, r->ms, r->gbs,
	       copy_gbs > 0 ? 100.0 * r->gbs / copy_gbs : 0.0, r->note);
	fflush(stdout);
	return r;
}

/* ---- timing ------------------------------------------------------------------------ */

typedef int (*bench_fn)(void *ctx);

static float time_it(bench_fn fn, void *ctx)
{
	cudaEvent_t a, b;
	float t[REPS];

	ck(cudaEventCreate(&a), "cudaEventCreate");
	ck(cudaEventCreate(&b), "cudaEventCreate");
	for (int i = 0; i < WARM; i++)
		if (fn(ctx))
			exit(3);
	for (int i = 0; i < REPS; i++) {
		ck(cudaEventRecord(a, 0), "cudaEventRecord");
		if (fn(ctx))
			exit(3);
		ck(cudaEventRecord(b, 0), "cudaEventRecord");
		ck(cudaEventSynchronize(b), "cudaEventSynchronize");
		ck(cudaEventElapsedTime(&t[i], a, b), "cudaEventElapsedTime");
	}
	cudaEventDestroy(a);
	cudaEventDestroy(b);
	return median(t, REPS);
}

struct copy_ctx {
	void *dst, *src;
	size_t n;
};

static int do_copy(void *p)
{
	struct copy_ctx *c = p;

	ck(cudaMemcpy(c->dst, c->src, c->n, cudaMemcpyDeviceToDevice), "cudaMemcpy");
	return 0;
}

/* ---- the codec ------------------------------------------------------------------------ */

struct q_ctx {
	struct ms_nvfp4_params p;
	struct ms_nvfp4_src src;  /* device */
	float amax;
	uint8_t *pk, *sc, *pkt, *sct; /* device, NULL when not wanted */
};

static int do_quant(void *p)
{
	struct q_ctx *q = p;
	struct ms_err err = {0};

	if (ms_gpu_nvfp4_quantize(&q->p, &q->src, q->amax, q->pk, q->sc, q->pkt, q->sct, &err)) {
		fprintf(stderr, "bench_gpu: quantize: %s\n", err.msg);
		return 1;
	}
	return 0;
}

struct dq_ctx {
	uint8_t *pk, *sc;
	uint64_t rows, cols;
	float ts;
	enum ms_nvfp4_tscale_kind kind;
	void *out;
};

static int do_dequant(void *p)
{
	struct dq_ctx *d = p;
	struct ms_err err = {0};

	if (ms_gpu_nvfp4_dequantize(d->pk, d->sc, d->rows, d->cols, d->ts, d->kind,
				    MS_DTYPE_BF16, d->out, &err)) {
		fprintf(stderr, "bench_gpu: dequantize: %s\n", err.msg);
		return 1;
	}
	return 0;
}

struct t_ctx {
	uint8_t *pk, *sc, *pkt, *sct;
	uint64_t rows, cols;
};

static int do_transpose(void *p)
{
	struct t_ctx *t = p;
	struct ms_err err = {0};

	if (ms_gpu_nvfp4_transpose(MS_NVFP4_BLOCK_2D, t->rows, t->cols, t->pk, t->sc, t->pkt,
				   t->sct, &err)) {
		fprintf(stderr, "bench_gpu: transpose: %s\n", err.msg);
		return 1;
	}
	return 0;
}

struct a_ctx {
	struct ms_nvfp4_src src;
	float amax;
};

static int do_amax(void *p)
{
	struct a_ctx *a = p;
	struct ms_err err = {0};

	if (ms_gpu_nvfp4_amax(&a->src, 0, &a->amax, &err)) {
		fprintf(stderr, "bench_gpu: amax: %s\n", err.msg);
		return 1;
	}
	return 0;
}

struct tree_ctx {
	const void *data;
	uint64_t n;
	uint8_t *out;
};

static int do_tree(void *p)
{
	struct tree_ctx *t = p;
	struct ms_err err = {0};

	if (ms_gpu_tree_chunks(t->data, t->n, MS_TREE_LOG2, t->out, NULL, &err)) {
		fprintf(stderr, "bench_gpu: tree: %s\n", err.msg);
		return 1;
	}
	return 0;
}

static void *dmalloc(uint64_t n)
{
	void *p = NULL;
	struct ms_err err = {0};

	if (ms_gpu_malloc(&p, n, &err))
		die("device memory", &err);
	return p;
}

static void d2h(void *h, const void *d, uint64_t n)
{
	ck(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost), "cudaMemcpy");
}

/* Rows [0, SLICE) of the source against the reference: rowwise rows
 * 0..SLICE-1, columnwise bytes [c][0, SLICE/2) and scales [c][0, SLICE/16). */
static int check_slice(const struct q_ctx *q, const char *name)
{
	const uint64_t C = q->src.cols, R = q->src.rows, es = q->src.dtype == MS_DTYPE_F32 ? 4 : 2;
	const uint64_t cp = (C + 15) / 16 * 16, rp = (R + 15) / 16 * 16;
	struct ms_nvfp4_params p = q->p;
	struct ms_nvfp4_src s = q->src;
	struct ms_err err = {0};
	uint8_t *hsrc = malloc(SLICE * C * es), *ref = malloc(cp * SLICE), *got = malloc(cp * SLICE);
	int ok = 1;

	if (!hsrc || !ref || !got)
		die("memory", NULL);
	d2h(hsrc, q->src.data, SLICE * C * es);
	s.data = hsrc;
	s.rows = SLICE;
	if (q->pk) {
		p.layout = MS_NVFP4_LAYOUT_ROWWISE;
		if (ms_nvfp4_quantize_ref(&p, &s, q->amax, ref, ref + SLICE * cp / 2, &err))
			die("reference", &err);
		d2h(got, q->pk, SLICE * cp / 2);
		d2h(got + SLICE * cp / 2, q->sc, SLICE * cp / 16);
		ok &= !memcmp(got, ref, SLICE * cp / 2 + SLICE * cp / 16);
	}
	if (q->pkt) {
		p.layout = MS_NVFP4_LAYOUT_COLUMNWISE;
		if (ms_nvfp4_quantize_ref(&p, &s, q->amax, ref, ref + C * SLICE / 2, &err))
			die("reference", &err);
		ck(cudaMemcpy2D(got, SLICE / 2, q->pkt, rp / 2, SLICE / 2, C, cudaMemcpyDeviceToHost),
		   "cudaMemcpy2D");
		ck(cudaMemcpy2D(got + C * SLICE / 2, SLICE / 16, q->sct, rp / 16, SLICE / 16, C,
				cudaMemcpyDeviceToHost), "cudaMemcpy2D");
		ok &= !memcmp(got, ref, C * SLICE / 2 + C * SLICE / 16);
	}
	if (!ok)
		fprintf(stderr, "bench_gpu: %s: output differs from the CPU reference\n", name);
	free(hsrc);
	free(ref);
	free(got);
	return ok;
}

static int all_ok = 1;

static void bench_quant(const char *name, enum ms_nvfp4_recipe recipe, enum ms_nvfp4_block block,
			int row, int col, const struct ms_nvfp4_src *src, float amax,
			uint8_t *pk, uint8_t *sc, uint8_t *pkt, uint8_t *sct, const char *shape)
{
	struct q_ctx q;
	const uint64_t R = src->rows, C = src->cols, cp = (C + 15) / 16 * 16, rp = (R + 15) / 16 * 16;
	double bytes = (double)(R * C * (src->dtype == MS_DTYPE_F32 ? 4 : 2));
	int ok;

	memset(&q, 0, sizeof(q));
	q.p.recipe = recipe;
	q.p.block = block;
	q.src = *src;
	q.amax = amax;
	if (row) {
		q.pk = pk;
		q.sc = sc;
		bytes += (double)(R * cp / 2 + R * cp / 16);
	}
	if (col) {
		q.pkt = pkt;
		q.sct = sct;
		bytes += (double)(C * rp / 2 + C * rp / 16);
	}
	if (do_quant(&q))
		exit(3);
	ok = check_slice(&q, name);
	all_ok &= ok;
	add_row(name, shape, bytes, time_it(do_quant, &q), ok ? "bytes = reference" : "DIFFERS");
}

/* ---- verified load ------------------------------------------------------------------- */

#define VL_TENSOR (16u << 20)
#define VL_CHUNK (1u << 20)

/* work of the plain loaders: tensors cut into MS_VLOAD_SPAN spans, as the
 * verified load cuts tensors with trees, so a large tensor is shared by
 * every thread in the baseline too */
struct punit {
	size_t item;
	uint64_t off, len;
};

static struct punit *punits(struct ms_vload_item *items, size_t n, size_t *nu)
{
	struct punit *u = NULL;
	size_t k = 0, cap = 0;

	for (size_t i = 0; i < n; i++) {
		uint64_t nb = items[i].tensor->nbytes, off = 0;

		do {
			uint64_t len = nb - off > MS_VLOAD_SPAN ? MS_VLOAD_SPAN : nb - off;

			if (k == cap) {
				cap = cap ? 2 * cap : 256;
				u = realloc(u, cap * sizeof(*u));
				if (!u)
					die("memory", NULL);
			}
			u[k].item = i;
			u[k].off = off;
			u[k++].len = len;
			off += len;
		} while (off < nb);
	}
	*nu = k;
	return u;
}

struct plain {
	struct ms_vload_item *items;
	struct punit *u;
	size_t n, next;
	pthread_mutex_t lock;
	uint8_t *base;
	uint64_t *offs;
};

static void *plain_worker(void *arg)
{
	struct plain *pl = arg;
	cudaStream_t st;
	cudaEvent_t ev[2];
	uint8_t *pin[2];
	unsigned slot = 0;

	ck(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
	for (int b = 0; b < 2; b++) {
		ck(cudaEventCreateWithFlags(&ev[b], cudaEventDisableTiming), "cudaEventCreate");
		ck(cudaHostAlloc((void **)&pin[b], VL_CHUNK, cudaHostAllocDefault), "cudaHostAlloc");
	}
	for (;;) {
		const struct ms_tensor *t;
		const struct punit *u;
		size_t i, k;
		int fd;

		pthread_mutex_lock(&pl->lock);
		k = pl->next++;
		pthread_mutex_unlock(&pl->lock);
		if (k >= pl->n)
			break;
		u = &pl->u[k];
		i = u->item;
		t = pl->items[i].tensor;
		fd = open(t->file->path, O_RDONLY);
		if (fd < 0)
			die("open", NULL);
		for (uint64_t off = u->off; off < u->off + u->len; off += VL_CHUNK) {
			uint64_t end = u->off + u->len, len = end - off < VL_CHUNK ? end - off : VL_CHUNK;

			ck(cudaEventSynchronize(ev[slot]), "cudaEventSynchronize");
			if (pread(fd, pin[slot], len, (off_t)(t->offset + off)) != (ssize_t)len)
				die("pread", NULL);
			ck(cudaMemcpyAsync(pl->base + pl->offs[i] + off, pin[slot], len,
					   cudaMemcpyHostToDevice, st), "cudaMemcpyAsync");
			ck(cudaEventRecord(ev[slot], st), "cudaEventRecord");
			slot ^= 1;
		}
		close(fd);
	}
	ck(cudaStreamSynchronize(st), "cudaStreamSynchronize");
	for (int b = 0; b < 2; b++) {
		cudaEventDestroy(ev[b]);
		cudaFreeHost(pin[b]);
	}
	cudaStreamDestroy(st);
	return NULL;
}

/* the same pipeline as ms_load_verified_gpu, minus the hashing */
static void *plain_load(struct ms_vload_item *items, size_t n, int nt)
{
	struct plain pl;
	pthread_t th[64];
	uint64_t total = 0;

	memset(&pl, 0, sizeof(pl));
	pl.items = items;
	pl.u = punits(items, n, &pl.n);
	pl.offs = calloc(n, sizeof(*pl.offs));
	for (size_t i = 0; i < n; i++) {
		pl.offs[i] = total;
		total += (items[i].tensor->nbytes + 255) & ~(uint64_t)255;
	}
	ck(cudaMalloc((void **)&pl.base, total), "cudaMalloc");
	pthread_mutex_init(&pl.lock, NULL);
	for (int i = 0; i < nt; i++)
		pthread_create(&th[i], NULL, plain_worker, &pl);
	for (int i = 0; i < nt; i++)
		pthread_join(th[i], NULL);
	pthread_mutex_destroy(&pl.lock);
	free(pl.offs);
	free(pl.u);
	return pl.base;
}

static void *naive_load(struct ms_vload_item *items, size_t n)
{
	uint8_t *base;
	uint64_t total = 0, off = 0;

	for (size_t i = 0; i < n; i++)
		total += (items[i].tensor->nbytes + 255) & ~(uint64_t)255;
	ck(cudaMalloc((void **)&base, total), "cudaMalloc");
	for (size_t i = 0; i < n; i++) {
		ck(cudaMemcpy(base + off, items[i].tensor->data, items[i].tensor->nbytes,
			      cudaMemcpyHostToDevice), "cudaMemcpy");
		off += (items[i].tensor->nbytes + 255) & ~(uint64_t)255;
	}
	return base;
}

struct hplain {
	struct ms_vload_item *items;
	struct punit *u;
	size_t n, next;
	pthread_mutex_t lock;
};

static void *hplain_worker(void *arg)
{
	struct hplain *hp = arg;

	for (;;) {
		const struct ms_tensor *t;
		const struct punit *u;
		size_t i, k;
		int fd;

		pthread_mutex_lock(&hp->lock);
		k = hp->next++;
		pthread_mutex_unlock(&hp->lock);
		if (k >= hp->n)
			break;
		u = &hp->u[k];
		i = u->item;
		t = hp->items[i].tensor;
		fd = open(t->file->path, O_RDONLY);
		if (fd < 0)
			die("open", NULL);
		for (uint64_t off = u->off; off < u->off + u->len;) {
			ssize_t r = pread(fd, (uint8_t *)hp->items[i].dst + off, u->off + u->len - off,
					  (off_t)(t->offset + off));

			if (r <= 0)
				die("pread", NULL);
			off += (uint64_t)r;
		}
		close(fd);
	}
	return NULL;
}

/* plain threaded pread of every tensor into its destination */
static void plain_host_load(struct ms_vload_item *items, size_t n, int nt)
{
	struct hplain hp;
	pthread_t th[64];

	memset(&hp, 0, sizeof(hp));
	hp.items = items;
	hp.u = punits(items, n, &hp.n);
	pthread_mutex_init(&hp.lock, NULL);
	for (int i = 0; i < nt; i++)
		pthread_create(&th[i], NULL, hplain_worker, &hp);
	for (int i = 0; i < nt; i++)
		pthread_join(th[i], NULL);
	pthread_mutex_destroy(&hp.lock);
	free(hp.u);
}

static void make_vload(const char *path, uint64_t mb)
{
	struct ms_st_writer *w = NULL;
	struct ms_err err = {0};
	uint64_t n = mb * 1048576 / VL_TENSOR, shp[2] = {2048, 4096};
	uint8_t *buf = malloc(VL_TENSOR);

	if (!buf || !n)
		die("memory", NULL);
	if (ms_st_writer_new(path, 1, &w, &err))
		die("writer", &err);
	for (uint64_t i = 0; i < n; i++) {
		char name[64];

		snprintf(name, sizeof(name), "model.layers.%llu.mlp.experts.%llu.down_proj.weight",
			 (unsigned long long)(i / 64), (unsigned long long)(i % 64));
		if (ms_st_writer_declare(w, name, MS_DTYPE_BF16, 2, shp, &err))
			die("declare", &err);
	}
	for (uint64_t k = 0; k < VL_TENSOR / 2; k++) {
		uint16_t h = ms_f32_to_bf16(gauss());

		memcpy(buf + 2 * k, &h, 2);
	}
	for (uint64_t i = 0; i < n; i++) {
		memcpy(buf, &i, sizeof(i)); /* every tensor distinct */
		if (ms_st_writer_data(w, buf, VL_TENSOR, &err))
			die("write", &err);
	}
	if (ms_st_writer_commit(w, &err))
		die("commit", &err);
	ms_st_writer_free(w);
	free(buf);
}

/* one 2 GiB bf16 tensor and many small ones (64 KiB .. 2 MiB, odd sizes):
 * a checkpoint with an embedding-sized tensor beside expert-sized ones */
#define VL2_BIG (2048ull << 20)
#define VL2_SMALL 256

static void make_vload2(const char *path)
{
	struct ms_st_writer *w = NULL;
	struct ms_err err = {0};
	uint64_t shp[2] = {65536, 16384}, ssz[VL2_SMALL];
	uint8_t *buf = malloc(VL_TENSOR);

	if (!buf)
		die("memory", NULL);
	if (ms_st_writer_new(path, 1, &w, &err))
		die("writer", &err);
	if (ms_st_writer_declare(w, "model.embed_tokens.weight", MS_DTYPE_BF16, 2, shp, &err))
		die("declare", &err);
	for (int i = 0; i < VL2_SMALL; i++) {
		char name[64];
		uint64_t n;

		ssz[i] = (32768 + next_rand() % (1u << 20)) & ~1ull; /* elements: 64 KiB .. 2 MiB */
		n = ssz[i];
		snprintf(name, sizeof(name), "model.layers.%d.norm.weight", i);
		if (ms_st_writer_declare(w, name, MS_DTYPE_BF16, 1, &n, &err))
			die("declare", &err);
	}
	for (uint64_t k = 0; k < VL_TENSOR / 2; k++) {
		uint16_t h = ms_f32_to_bf16(gauss());

		memcpy(buf + 2 * k, &h, 2);
	}
	for (uint64_t off = 0; off < VL2_BIG; off += VL_TENSOR) {
		memcpy(buf, &off, sizeof(off));
		if (ms_st_writer_data(w, buf, VL_TENSOR, &err))
			die("write", &err);
	}
	for (int i = 0; i < VL2_SMALL; i++) {
		memcpy(buf, &i, sizeof(i));
		if (ms_st_writer_data(w, buf, ssz[i] * 2, &err))
			die("write", &err);
	}
	if (ms_st_writer_commit(w, &err))
		die("commit", &err);
	ms_st_writer_free(w);
	free(buf);
}

/* --load-only: no codec rows, and of the loads only plain and trees (a
 * short run to try a change of the tree path) */
static int load_only;

static void bench_vload(const char *path, double torch_load_ms, int big)
{
	char shape[48];
	struct ms_st_file *f = NULL;
	struct ms_err err = {0};
	struct ms_vload_item *items;
	uint64_t n, bytes = 0;
	uint8_t *buf = malloc(VL_TENSOR);
	int nt = ms_ncpus() < 16 ? ms_ncpus() : 16;
	float tp[5], tv[5], tn[5], th[5], thp[5], ts[5], tt[5], tw[5], tht[5];
	double t0;

	if (!buf)
		die("memory", NULL);
	if (ms_st_open(path, &f, &err))
		die("open", &err);
	/* the expected digests, as an inventory would hold them (untimed) */
	if (ms_st_hash_files(&f, 1, 0, 0, &err))
		die("hash", &err);
	n = f->ntensors;
	items = calloc(n, sizeof(*items));
	for (uint64_t i = 0; i < n; i++) {
		items[i].tensor = &f->tensors[i];
		memcpy(items[i].expected, f->tensors[i].digest, MS_SHA256_LEN);
		bytes += f->tensors[i].nbytes;
	}
	/* warm the page cache: one read of the whole file */
	{
		int fd = open(path, O_RDONLY);

		while (fd >= 0 && read(fd, buf, VL_TENSOR) > 0)
			;
		if (fd >= 0)
			close(fd);
	}
	/* the tree digests, as an inventory would hold them (untimed) */
	for (uint64_t i = 0; i < n; i++)
		if (ms_tree_digest(items[i].tensor->data, items[i].tensor->nbytes, MS_TREE_LOG2, 0,
				   items[i].expected_tree, &err))
			die("tree", &err);
	for (int r = 0; r < 5; r++) {
		void *arena = NULL, *p;

		ck(cudaDeviceSynchronize(), "sync");
		t0 = ms_now();
		p = plain_load(items, n, nt);
		tp[r] = (float)((ms_now() - t0) * 1e3);
		ck(cudaFree(p), "cudaFree");
		t0 = ms_now();
		if (ms_load_verified_gpu(items, n, nt, &arena, &err))
			die("ms_load_verified_gpu", &err);
		tv[r] = (float)((ms_now() - t0) * 1e3);
		ck(cudaFree(arena), "cudaFree");
		/* with tree digests: no CPU hashing, chunks hashed in HBM */
		for (uint64_t i = 0; i < n; i++)
			items[i].use_tree = 1;
		t0 = ms_now();
		if (ms_load_verified_gpu(items, n, nt, &arena, &err))
			die("ms_load_verified_gpu (trees)", &err);
		tt[r] = (float)((ms_now() - t0) * 1e3);
		ck(cudaFree(arena), "cudaFree");
		for (uint64_t i = 0; i < n; i++)
			items[i].use_tree = 0;
		if (load_only) {
			tv[r] = tw[r] = tn[r] = 0;
			continue;
		}
		/* the first load of a state without trees: plain digests on
		 * the CPU, trees on both sides, cross-checked */
		for (uint64_t i = 0; i < n; i++) {
			items[i].use_tree = 0;
			items[i].want_tree = 1;
		}
		t0 = ms_now();
		if (ms_load_verified_gpu(items, n, nt, &arena, &err))
			die("ms_load_verified_gpu (first)", &err);
		tw[r] = (float)((ms_now() - t0) * 1e3);
		ck(cudaFree(arena), "cudaFree");
		for (uint64_t i = 0; i < n; i++) {
			if (!items[i].has_got_tree ||
			    memcmp(items[i].got_tree, items[i].expected_tree, MS_SHA256_LEN))
				die("first load: the device tree differs from the cpu's", NULL);
			items[i].want_tree = 0;
		}
		t0 = ms_now();
		p = naive_load(items, n);
		tn[r] = (float)((ms_now() - t0) * 1e3);
		ck(cudaFree(p), "cudaFree");
	}
	if (load_only) {
		float mp = median(tp, 5), mt = median(tt, 5);

		printf("%s: plain %.3f ms, trees %.3f ms: %+.1f%%\n", big ? "2 GiB + small" : "16 MiB",
		       mp, mt, 100.0 * (mt / mp - 1.0));
		ms_st_close(f);
		free(items);
		free(buf);
		return;
	}
	/* the hashing ceiling: SHA-256 of the same bytes (mapped, in the page
	 * cache) on the same threads, with no copy at all; no verified load
	 * can be faster */
	for (int r = 0; r < 5; r++) {
		t0 = ms_now();
		if (ms_st_hash_files(&f, 1, nt, 0, &err))
			die("hash", &err);
		ts[r] = (float)((ms_now() - t0) * 1e3);
	}
	/* host variant against a plain threaded pread into the same memory */
	for (uint64_t i = 0; i < n; i++) {
		items[i].dst = malloc(items[i].tensor->nbytes);
		memset(items[i].dst, 0, items[i].tensor->nbytes);
	}
	for (int r = 0; r < 5; r++) {
		t0 = ms_now();
		plain_host_load(items, n, nt);
		thp[r] = (float)((ms_now() - t0) * 1e3);
		t0 = ms_now();
		if (ms_load_verified(items, n, nt, &err))
			die("ms_load_verified", &err);
		th[r] = (float)((ms_now() - t0) * 1e3);
		for (uint64_t i = 0; i < n; i++)
			items[i].use_tree = 1;
		t0 = ms_now();
		if (ms_load_verified(items, n, nt, &err))
			die("ms_load_verified (trees)", &err);
		tht[r] = (float)((ms_now() - t0) * 1e3);
		for (uint64_t i = 0; i < n; i++)
			items[i].use_tree = 0;
	}
	if (big)
		snprintf(shape, sizeof(shape), "2 GiB + %llu small", (unsigned long long)(n - 1));
	else
		snprintf(shape, sizeof(shape), "%llu x 16 MiB", (unsigned long long)n);
	{
		float mp = median(tp, 5), mv = median(tv, 5), mn = median(tn, 5);
		float mh = median(th, 5), mhp = median(thp, 5), ms = median(ts, 5);
		float mt = median(tt, 5), mw = median(tw, 5), mht = median(tht, 5);
		char note[96];

		snprintf(note, sizeof(note), "%d threads, 1 MiB chunks", nt);
		add_row("load to gpu: plain (pinned pipeline, no hash)", shape, (double)bytes, mp, note);
		snprintf(note, sizeof(note), "tree digests, chunks hashed in HBM: %+.1f%% over plain "
			 "(target <= 10%%)", 100.0 * (mt / mp - 1.0));
		add_row("load to gpu: ms_load_verified_gpu, trees", shape, (double)bytes, mt, note);
		snprintf(note, sizeof(note), "plain sha-256 on the cpu: %+.1f%% over plain",
			 100.0 * (mv / mp - 1.0));
		add_row("load to gpu: ms_load_verified_gpu, no trees", shape, (double)bytes, mv, note);
		snprintf(note, sizeof(note), "no trees yet: plain + cpu tree + gpu tree, %+.1f%%",
			 100.0 * (mw / mp - 1.0));
		add_row("load to gpu: first load, trees made", shape, (double)bytes, mw, note);
		snprintf(note, sizeof(note), "%d threads; floor of any verified load: %+.1f%% over plain",
			 nt, 100.0 * ((ms > mp ? ms : mp) / mp - 1.0));
		add_row("load ceiling: sha-256 of the bytes, no copy", shape, (double)bytes, ms,
			note);
		add_row("load to gpu: naive (cudaMemcpy from mmap)", shape, (double)bytes, mn, "");
		if (torch_load_ms > 0 && !big) {
			snprintf(note, sizeof(note), "verified (trees) is %+.1f%% against it",
				 100.0 * (mt / torch_load_ms - 1.0));
			add_row("load to gpu: safetensors.torch.load_file", shape, (double)bytes,
				torch_load_ms, note);
		}
		snprintf(note, sizeof(note), "%d threads", nt);
		add_row("load to host: plain pread", shape, (double)bytes, mhp, note);
		snprintf(note, sizeof(note), "%d threads; overhead vs plain %+.1f%%", nt,
			 100.0 * (mh / mhp - 1.0));
		add_row("load to host: ms_load_verified, no trees", shape, (double)bytes, mh, note);
		snprintf(note, sizeof(note), "%d threads; %+.1f%% over plain; %.1fx the plain digest",
			 nt, 100.0 * (mht / mhp - 1.0), mh / mht);
		add_row("load to host: ms_load_verified, trees", shape, (double)bytes, mht, note);
	}
	if (big) {
		/* the single 2 GiB tensor alone: one stream against every core */
		float a[5], b[5];
		char note[96];

		for (int r = 0; r < 5; r++) {
			items[0].use_tree = 0;
			t0 = ms_now();
			if (ms_load_verified(items, 1, nt, &err))
				die("ms_load_verified", &err);
			a[r] = (float)((ms_now() - t0) * 1e3);
			items[0].use_tree = 1;
			t0 = ms_now();
			if (ms_load_verified(items, 1, nt, &err))
				die("ms_load_verified (tree)", &err);
			b[r] = (float)((ms_now() - t0) * 1e3);
		}
		snprintf(note, sizeof(note), "today's digest: one sequential stream");
		add_row("load to host: one 2 GiB tensor, no tree", "2 GiB",
			(double)items[0].tensor->nbytes, median(a, 5), note);
		snprintf(note, sizeof(note), "%d threads: %.1fx faster (target >= 8x)", nt,
			 median(a, 5) / median(b, 5));
		add_row("load to host: one 2 GiB tensor, tree", "2 GiB",
			(double)items[0].tensor->nbytes, median(b, 5), note);
	}
	for (uint64_t i = 0; i < n; i++)
		free(items[i].dst);
	ms_st_close(f);
	free(items);
	free(buf);
}

/* ---- dump for the torch check ------------------------------------------------------ */

static void dump_file(const char *dir, const char *name, const void *p, size_t n)
{
	char path[1024];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "wb");
	if (!f || fwrite(p, 1, n, f) != n || fclose(f))
		die(path, NULL);
}

static void dump_case(const char *dir)
{
	const uint64_t R = 512, C = 1024;
	struct ms_nvfp4_params p = {0};
	struct ms_nvfp4_src s = {MS_DTYPE_BF16, NULL, R, C};
	struct ms_err err = {0};
	uint16_t *x = malloc(R * C * 2);
	uint8_t *pk = malloc(R * C / 2), *sc = malloc(R * C / 16), *pkt = malloc(R * C / 2),
		*sct = malloc(R * C / 16);
	char meta[128];
	float amax;

	for (uint64_t i = 0; i < R * C; i++)
		x[i] = ms_f32_to_bf16(gauss());
	s.data = x;
	if (ms_gpu_nvfp4_amax(&s, 0, &amax, &err) ||
	    ms_gpu_nvfp4_quantize(&p, &s, amax, pk, sc, pkt, sct, &err))
		die("dump", &err);
	dump_file(dir, "x.bf16", x, R * C * 2);
	dump_file(dir, "packed.u8", pk, R * C / 2);
	dump_file(dir, "scales.u8", sc, R * C / 16);
	dump_file(dir, "packed_t.u8", pkt, R * C / 2);
	dump_file(dir, "scales_t.u8", sct, R * C / 16);
	snprintf(meta, sizeof(meta), "%llu %llu %.9g\n", (unsigned long long)R,
		 (unsigned long long)C, (double)amax);
	dump_file(dir, "meta.txt", meta, strlen(meta));
	free(x);
	free(pk);
	free(sc);
	free(pkt);
	free(sct);
}

/* ---- main -------------------------------------------------------------------------- */

static void write_md(const char *path, const char *dev, uint64_t R, uint64_t C, double torch_ms,
		     const char *torch_check, double both_ms)
{
	FILE *f = fopen(path, "w");
	char date[64];
	time_t now = time(NULL);

	if (!f)
		die(path, NULL);
	strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", gmtime(&now));
	fprintf(f, "# GPU benchmark results\n\n");
	fprintf(f, "Written by `make bench-gpu` (tools/bench/bench-gpu.sh) on %s.\n\n", date);
	fprintf(f, "Device: %s.\n\n", dev);
	fprintf(f, "Kernels: median of %d runs after %d warm-ups, CUDA events around the library "
		   "call; bandwidth = bytes read + bytes written over that time; %% is of the "
		   "measured device-to-device copy. Input: bf16 [%llu, %llu] (f32 [%llu, %llu]), "
		   "random normal weights. Every kernel row was checked byte for byte against the "
		   "CPU reference on the first %d rows first.\n\n",
		REPS, WARM, (unsigned long long)R, (unsigned long long)C,
		(unsigned long long)(R / 2), (unsigned long long)C, SLICE);
	fprintf(f, "| operation | shape | time (ms) | GB/s | of copy | note |\n");
	fprintf(f, "|---|---|---:|---:|---:|---|\n");
	for (int i = 0; i < nrows; i++) {
		struct row *r = &rows_out[i];

		if (r->vs_copy)
			fprintf(f, "| %s | %s | %.3f | %.1f | %.0f%% | %s |\n", r->name, r->shape, r->ms,
				r->gbs, copy_gbs > 0 ? 100.0 * r->gbs / copy_gbs : 0.0, r->note);
		else
			fprintf(f, "| %s | %s | %.3f | %.1f | - | %s |\n", r->name, r->shape, r->ms,
				r->gbs, r->note);
	}
	if (torch_ms > 0) {
		fprintf(f, "\nPyTorch eager peer (tools/bench/bench_torch.py: the modelopt recipe, 1D "
			   "blocks, rowwise + columnwise, same shape, same GPU): %.3f ms; ours "
			   "(modelopt 1D, both layouts in one pass): %.3f ms: **%.1fx** (target >= 5x). "
			   "%s\n", torch_ms, both_ms, torch_ms / both_ms, torch_check ? torch_check : "");
	}
	fprintf(f, "\nTargets: quantize (both layouts, one pass) and dequantize >= 80%% of the copy "
		   "bandwidth; PyTorch eager >= 5x slower; verified load with tree digests <= 10%% "
		   "over the plain pinned load (goal <= 5%%); tree chunk kernel >= 500 GB/s on 64 KiB "
		   "chunks; host verified load of one 2 GiB tensor with its tree >= 8x faster than "
		   "the one-stream digest.\n");
	fprintf(f, "\nLoad rows: safetensors files on the local disk (16 MiB bf16 tensors; one 2 "
		   "GiB bf16 tensor and 256 small ones of 64 KiB to 2 MiB), read once before timing "
		   "(warm page cache); median of 5 runs, device allocation included. \"trees\": "
		   "each tensor checked against its tree digest (ms(5)), which the inventory records "
		   "beside the plain SHA-256; \"no trees\": the plain SHA-256 on the CPU; \"first "
		   "load\": no trees recorded yet, so the plain digest on the CPU plus the tree of "
		   "the same bytes on the CPU and of the device copy on the GPU, which must agree.\n");
	if (fclose(f))
		die(path, NULL);
}

int main(int argc, char **argv)
{
	uint64_t R = 32768, C = 32768, vmb = 3072;
	const char *out = NULL, *vfile = NULL, *vmake = NULL, *dump = NULL, *tcheck = NULL;
	const char *vfile2 = NULL, *vmake2 = NULL;
	double torch_ms = 0, torch_load_ms = 0, both_ms = 0;
	char dev[256], shape[48], shape32[48];
	struct ms_err err = {0};

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		uint64_t u;

		if (!strcmp(a, "--load-only")) {
			load_only = 1;
			continue;
		}
		if (!v) {
			fprintf(stderr, "bench_gpu: %s needs a value\n", a);
			return 2;
		}
		if (!strcmp(a, "--rows") && !ms_parse_u64(v, 1u << 20, &u))
			R = u;
		else if (!strcmp(a, "--cols") && !ms_parse_u64(v, 1u << 20, &u))
			C = u;
		else if (!strcmp(a, "--vload-mb") && !ms_parse_u64(v, 1u << 20, &u))
			vmb = u;
		else if (!strcmp(a, "--torch-ms"))
			torch_ms = atof(v);
		else if (!strcmp(a, "--torch-check"))
			tcheck = v;
		else if (!strcmp(a, "--vload-file"))
			vfile = v;
		else if (!strcmp(a, "--make-vload"))
			vmake = v;
		else if (!strcmp(a, "--make-vload2"))
			vmake2 = v;
		else if (!strcmp(a, "--vload2-file"))
			vfile2 = v;
		else if (!strcmp(a, "--torch-load-ms"))
			torch_load_ms = atof(v);
		else if (!strcmp(a, "--dump"))
			dump = v;
		else if (!strcmp(a, "--out"))
			out = v;
		else {
			fprintf(stderr, "bench_gpu: bad option %s %s\n", a, v);
			return 2;
		}
		i++;
	}
	if (R % 256 || C % 256) {
		fprintf(stderr, "bench_gpu: --rows and --cols must be multiples of 256\n");
		return 2;
	}
	if (vmake || vmake2) {
		if (vmake)
			make_vload(vmake, vmb);
		if (vmake2)
			make_vload2(vmake2);
		return 0;
	}
	if (ms_gpu_describe(dev, sizeof(dev), &err))
		die("no gpu", &err);
	printf("device: %s\n", dev);
	if (dump) {
		dump_case(dump);
		if (!out)
			return 0;
	}
	if (load_only) {
		if (vfile)
			bench_vload(vfile, 0, 0);
		if (vfile2)
			bench_vload(vfile2, 0, 1);
		return 0;
	}
	snprintf(shape, sizeof(shape), "[%llu, %llu]", (unsigned long long)R, (unsigned long long)C);
	snprintf(shape32, sizeof(shape32), "[%llu, %llu] f32", (unsigned long long)(R / 2),
		 (unsigned long long)C);
	{
		const uint64_t n = R * C, cp = C, rp = R;
		uint16_t *h = malloc(64u << 20);
		uint8_t *x = dmalloc(n * 2), *x2 = dmalloc(n * 2);
		uint8_t *pk = dmalloc(n / 2), *sc = dmalloc(n / 16), *pkt = dmalloc(n / 2),
			*sct = dmalloc(n / 16), *pk2 = dmalloc(n / 2), *sc2 = dmalloc(n / 16);
		struct ms_nvfp4_src src = {MS_DTYPE_BF16, x, R, C}, src32 = {MS_DTYPE_F32, x2, R / 2, C};
		struct copy_ctx cc = {x2, x, n * 2};
		struct a_ctx ac;
		struct ms_nvfp4_tscale t;
		float amax, amax32;
		float *hf = (float *)h;

		(void)cp;
		(void)rp;
		/* the copy ceiling */
		{
			float ms = time_it(do_copy, &cc);

			copy_gbs = 2.0 * n * 2 / (ms * 1e-3) / 1e9;
			add_row("copy device to device (cudaMemcpy)", shape, 2.0 * n * 2, ms,
				"the ceiling");
		}
		/* f32 source first (it borrows x2, the copy target), then bf16 */
		for (uint64_t k = 0; k < (16u << 20); k++)
			hf[k] = gauss() * 50.0f;
		for (uint64_t off = 0; off < n * 2; off += 64u << 20)
			ck(cudaMemcpy(x2 + off, h, 64u << 20, cudaMemcpyHostToDevice), "cudaMemcpy");
		for (uint64_t k = 0; k < (32u << 20); k++)
			h[k] = ms_f32_to_bf16(gauss());
		for (uint64_t off = 0; off < n * 2; off += 64u << 20)
			ck(cudaMemcpy(x + off, h, 64u << 20, cudaMemcpyHostToDevice), "cudaMemcpy");
		ac.src = src;
		add_row("amax (reduction)", shape, (double)n * 2, time_it(do_amax, &ac), "");
		amax = ac.amax;
		ac.src = src32;
		if (do_amax(&ac))
			return 3;
		amax32 = ac.amax;

		bench_quant("quantize modelopt 1D rowwise", MS_NVFP4_RECIPE_MODELOPT,
			    MS_NVFP4_BLOCK_1D, 1, 0, &src, amax, pk, sc, pkt, sct, shape);
		bench_quant("quantize modelopt 1D columnwise", MS_NVFP4_RECIPE_MODELOPT,
			    MS_NVFP4_BLOCK_1D, 0, 1, &src, amax, pk, sc, pkt, sct, shape);
		bench_quant("quantize modelopt 1D both layouts", MS_NVFP4_RECIPE_MODELOPT,
			    MS_NVFP4_BLOCK_1D, 1, 1, &src, amax, pk, sc, pkt, sct, shape);
		both_ms = rows_out[nrows - 1].ms;
		bench_quant("quantize compressed-tensors 1D both", MS_NVFP4_RECIPE_COMPRESSED_TENSORS,
			    MS_NVFP4_BLOCK_1D, 1, 1, &src, amax, pk, sc, pkt, sct, shape);
		bench_quant("quantize te 2D both layouts", MS_NVFP4_RECIPE_TE, MS_NVFP4_BLOCK_2D, 1, 1,
			    &src, amax, pk, sc, pkt, sct, shape);
		/* f32 input (x2 is overwritten by the dequantize below) */
		bench_quant("quantize modelopt 1D both (f32 input)", MS_NVFP4_RECIPE_MODELOPT,
			    MS_NVFP4_BLOCK_1D, 1, 1, &src32, amax32, pk, sc, pkt, sct, shape32);
		/* last: its outputs feed the dequantize and transpose rows */
		bench_quant("quantize modelopt 2D both layouts", MS_NVFP4_RECIPE_MODELOPT,
			    MS_NVFP4_BLOCK_2D, 1, 1, &src, amax, pk, sc, pkt, sct, shape);
		/* dequantize the rowwise 2D copy; transpose it; compare with the
		 * columnwise copy quantize wrote */
		{
			struct dq_ctx d = {pk, sc, R, C, 0, MS_NVFP4_TSCALE_MUL, x2};
			struct t_ctx tc = {pk, sc, pk2, sc2, R, C};
			uint8_t *a = malloc(n / 2), *b = malloc(n / 2);
			uint64_t on = R * C * 2;
			uint16_t *hw = malloc(SLICE * C * 2), *ref = malloc(SLICE * C * 2);
			int ok;

			if (ms_nvfp4_tscale_init(MS_NVFP4_RECIPE_MODELOPT, amax, &t, &err))
				die("tscale", &err);
			d.ts = t.stored;
			d.kind = t.kind;
			if (do_dequant(&d))
				return 3;
			{
				uint8_t *hp = malloc(SLICE * C / 2), *hs = malloc(SLICE * C / 16);

				d2h(hp, pk, SLICE * C / 2);
				d2h(hs, sc, SLICE * C / 16);
				d2h(hw, x2, SLICE * C * 2);
				if (ms_nvfp4_dequantize_ref(hp, hs, SLICE, C, t.stored, t.kind,
							    MS_DTYPE_BF16, ref, &err))
					die("reference", &err);
				ok = !memcmp(hw, ref, SLICE * C * 2);
				all_ok &= ok;
				free(hp);
				free(hs);
			}
			add_row("dequantize to bf16", shape, (double)(n / 2 + n / 16 + on),
				time_it(do_dequant, &d), ok ? "bytes = reference" : "DIFFERS");
			if (do_transpose(&tc))
				return 3;
			d2h(a, pk2, n / 2);
			d2h(b, pkt, n / 2);
			ok = !memcmp(a, b, n / 2);
			d2h(a, sc2, n / 16);
			d2h(b, sct, n / 16);
			ok &= !memcmp(a, b, n / 16);
			all_ok &= ok;
			add_row("transpose 2D rowwise -> columnwise", shape,
				2.0 * (double)(n / 2 + n / 16), time_it(do_transpose, &tc),
				ok ? "bytes = quantized columnwise" : "DIFFERS");
			free(a);
			free(b);
			free(hw);
			free(ref);
		}
		/* the tree digests' chunk kernel over the bf16 weight (2 GiB,
		 * 64 KiB chunks), checked first against the CPU's tree of a
		 * 64 MiB slice */
		{
			struct tree_ctx tc2 = {x, n * 2, NULL};
			const uint64_t sl = 64u << 20;
			uint8_t *hs = malloc(sl), tg[32], tcpu[32];
			int ok;

			ck(cudaMalloc((void **)&tc2.out, ms_tree_nchunks(n * 2, MS_TREE_LOG2) * 32),
			   "cudaMalloc");
			d2h(hs, x, sl);
			if (ms_gpu_tree_digest(x, sl, MS_TREE_LOG2, tg, &err) ||
			    ms_tree_digest(hs, sl, MS_TREE_LOG2, 0, tcpu, &err))
				die("tree", &err);
			ok = !memcmp(tg, tcpu, 32);
			all_ok &= ok;
			add_row("tree digest chunks (sha-256, 64 KiB each)", shape, (double)n * 2,
				time_it(do_tree, &tc2), ok ? "one thread per chunk; tree = cpu's" : "DIFFERS");
			ck(cudaFree(tc2.out), "cudaFree");
			free(hs);
		}
		/* the streaming helper: host memory in and out */
		{
			const uint64_t hr = R / 4;
			uint16_t *hx = malloc(hr * C * 2);
			uint8_t *o1 = malloc(hr * C / 2), *o2 = malloc(hr * C / 16),
				*o3 = malloc(hr * C / 2), *o4 = malloc(hr * C / 16);
			struct ms_nvfp4_params p = {0};
			struct ms_nvfp4_src hs = {MS_DTYPE_BF16, hx, hr, C};
			char hshape[48];
			float tt[5];

			d2h(hx, x, hr * C * 2);
			for (int r = 0; r < 5; r++) {
				double t0 = ms_now();

				if (ms_gpu_nvfp4_quantize_host(&p, &hs, amax, 0, o1, o2, o3, o4, &err))
					die("quantize_host", &err);
				tt[r] = (float)((ms_now() - t0) * 1e3);
			}
			snprintf(hshape, sizeof(hshape), "[%llu, %llu]", (unsigned long long)hr,
				 (unsigned long long)C);
			add_row("quantize 1D both, host memory (streamed)", hshape,
				(double)(hr * C * 2 + 2 * (hr * C / 2 + hr * C / 16)), median(tt, 5),
				"pageable in and out, incl. CPU copies");
			free(hx);
			free(o1);
			free(o2);
			free(o3);
			free(o4);
		}
		free(h);
		ms_gpu_free(x);
		ms_gpu_free(x2);
		ms_gpu_free(pk);
		ms_gpu_free(sc);
		ms_gpu_free(pkt);
		ms_gpu_free(sct);
		ms_gpu_free(pk2);
		ms_gpu_free(sc2);
	}
	if (vfile)
		bench_vload(vfile, torch_load_ms, 0);
	if (vfile2)
		bench_vload(vfile2, 0, 1);
	if (torch_ms > 0)
		printf("torch eager modelopt 1D both: %.3f ms; ours %.3f ms: %.1fx\n", torch_ms,
		       both_ms, torch_ms / both_ms);
	if (out)
		write_md(out, dev, R, C, torch_ms, tcheck, both_ms);
	if (!all_ok)
		fprintf(stderr, "bench_gpu: some outputs differ from the reference\n");
	return all_ok ? 0 : 1;
}
