/*
 * model_nogpu.c: the CUDA half of the trainer model (model_int.h) in a
 * build without nvcc: a model asked for on the GPU is refused with one line
 * saying so; nothing pretends to compute. With nvcc, kernels/train.cu
 * provides these and this file compiles to nothing.
 */
#ifndef MS_HAVE_CUDA

#include "train/model_int.h"

static int nodev(struct ms_err *err)
{
	return ms_err_set(err, MS_ENODEV,
			  "--device cuda: no gpu support in this build (built without nvcc)");
}

int ms_gmodel_build(struct ms_model *m, struct ms_err *err)
{
	(void)m;
	return nodev(err);
}

int ms_gmodel_blas_load(struct ms_err *err)
{
	return nodev(err);
}

int ms_gmodel_xgemm_check(const uint16_t *x, const uint16_t *w, const uint32_t *cnt, uint32_t E,
			  uint32_t N, uint32_t K, float *y, uint16_t *yb, struct ms_err *err)
{
	(void)x, (void)w, (void)cnt, (void)E, (void)N, (void)K, (void)y, (void)yb;
	return nodev(err);
}

int ms_gmodel_sort_check(const int32_t *sel, uint32_t n, uint32_t E, int32_t *perm, int32_t *pos,
			 uint32_t *cnt, struct ms_err *err)
{
	(void)sel, (void)n, (void)E, (void)perm, (void)pos, (void)cnt;
	return nodev(err);
}

int ms_gmodel_norm_rope_check(const float *x, const float *w, const float *cs, const float *sn,
			      uint32_t rows, uint32_t n, uint32_t nhead, uint32_t half, uint32_t S,
			      float eps, const uint16_t *dy, uint32_t ldo, uint32_t c0, uint16_t *y,
			      float *rstd, uint16_t *dx, int *fast, struct ms_err *err)
{
	(void)x, (void)w, (void)cs, (void)sn, (void)rows, (void)n, (void)nhead, (void)half;
	(void)S, (void)eps, (void)dy, (void)ldo, (void)c0, (void)y, (void)rstd, (void)dx;
	*fast = 0;
	return nodev(err);
}

void ms_gmodel_free(struct ms_gmodel *g)
{
	(void)g;
}

int ms_gmodel_step(struct ms_model *m, const int32_t *ids, const uint8_t *loss_mask,
		   uint32_t batch, uint32_t seq, double grad_scale, uint64_t step,
		   ms_model_dlogits_fn fn, void *ctx, float *logits_out,
		   int backward, double *loss_sum, uint64_t *n_tokens,
		   struct ms_err *err)
{
	return nodev(err);
}

int ms_gmodel_sync(struct ms_model *m, struct ms_adamw *o, int dir,
		   struct ms_err *err)
{
	return nodev(err);
}

int ms_gmodel_zero_grad(struct ms_model *m, struct ms_err *err)
{
	return nodev(err);
}

int ms_gmodel_optim(struct ms_model *m, struct ms_adamw *o, double lr,
		    double *grad_norm, struct ms_err *err)
{
	return nodev(err);
}

int ms_gmodel_mem(const struct ms_model *m, struct ms_model_mem *out)
{
	return MS_ENODEV;
}

int ms_gmodel_kv_alloc(struct ms_model *m, struct ms_kv_cache *kv, struct ms_err *err)
{
	(void)m;
	(void)kv;
	return nodev(err);
}

void ms_gmodel_kv_free(struct ms_kv_cache *kv)
{
	(void)kv;
}

int ms_gmodel_decode(struct ms_model *m, struct ms_kv_cache *kv, const int32_t *ids,
		     float *logits, struct ms_err *err)
{
	return nodev(err);
}

int ms_gmodel_profile(const struct ms_model *m, char **json, struct ms_err *err)
{
	return nodev(err);
}

int ms_gmodel_routing(const struct ms_model *m, uint32_t l, int32_t *sel, float *probs,
		      struct ms_err *err)
{
	return nodev(err);
}

#endif
