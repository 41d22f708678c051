/*
 * sdpa.cpp: sdpa.h on the cuDNN frontend's graph API (header-only C++,
 * fetched with tools/fetch_headers.sh; MS_HAVE_CUDNN_FE), host code only,
 * so it is compiled by the C++ compiler rather than nvcc.
 *
 * The frontend is built with its dynamic loading: every cuDNN call goes
 * through dlsym on the handle this file opens (cudnn_dlhandle), and the
 * few CUDA runtime calls it makes of its own through libcudart.so, which
 * it opens itself. The frontend reports errors as statuses and, on a
 * library it cannot load, as exceptions; both become struct ms_err here,
 * and no exception leaves this file.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "common.h"
}
#include "flash.h"
#include "sdpa.h"

#ifdef MS_HAVE_CUDNN_FE

#include <dlfcn.h>
#include <pthread.h>

#include <memory>
#include <string>
#include <unordered_map>

#include <cudnn_frontend.h>

#include "sdpa_graph.hpp"

namespace fe = cudnn_frontend;

/* the frontend's dlsym handle (declared by cudnn_frontend_shim.h) */
namespace cudnn_frontend {
void *cudnn_dlhandle;
}

#define MS_STR2(x) #x
#define MS_STR(x) MS_STR2(x)
static const char cudnn_lib[] = "libcudnn.so." MS_STR(CUDNN_MAJOR);

static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;
static int load_state;               /* 0 not tried, 1 loaded, -1 failed */
static uint64_t load_ver;
static char load_why[256];

extern "C" uint64_t ms_sdpa_version(struct ms_err *err)
{
	pthread_mutex_lock(&load_mu);
	if (!load_state) {
		load_state = -1;
		void *h = dlopen(cudnn_lib, RTLD_NOW | RTLD_LOCAL);
		if (!h) {
			snprintf(load_why, sizeof load_why, "%s", dlerror());
		} else {
			fe::cudnn_dlhandle = h;
			try {
				load_ver = fe::detail::get_backend_version();
			} catch (const std::exception &e) {
				snprintf(load_why, sizeof load_why, "%s: %s", cudnn_lib, e.what());
			}
			/* the graphs below need cuDNN 9 (the header's major) */
			if (load_ver && load_ver / 10000 != CUDNN_MAJOR)
				snprintf(load_why, sizeof load_why,
					 "%s reports version %llu, not %d.x", cudnn_lib,
					 (unsigned long long)load_ver, CUDNN_MAJOR);
			else if (load_ver)
				load_state = 1;
		}
	}
	int ok = load_state == 1;
	pthread_mutex_unlock(&load_mu);
	if (ok)
		return load_ver;
	ms_err_set(err, MS_ENODEV, "cuDNN: %s", load_why);
	return 0;
}

using namespace ms_sdpa_graph;

struct ms_sdpa {
	cudnnHandle_t h;
	fe::graph::Graph fwd, bwd;
	int64_t ws;
};

/* validate, lower and plan g; the first failing step's message in err */
static int plan(fe::graph::Graph &g, cudnnHandle_t h, const char *which, int64_t *ws,
		struct ms_err *err)
{
	fe::error_t st = g.validate();
	if (st.is_good())
		st = g.build_operation_graph(h);
	if (st.is_good())
		st = g.create_execution_plans({fe::HeurMode_t::A});
	if (st.is_good())
		st = g.check_support(h);
	if (st.is_good())
		st = g.build_plans(h);
	if (st.is_good())
		st = g.get_workspace_size(*ws);
	if (st.is_bad())
		return ms_err_set(err, MS_EINVAL, "cuDNN SDPA %s: no plan: %s", which,
				  st.get_message().c_str());
	return MS_OK;
}

static int build(struct ms_sdpa *s, const struct ms_flash_shape *sh, struct ms_err *err)
{
	int64_t wf = 0, wb = 0;
	int rc;

	forward(s->fwd, sh);
	if ((rc = plan(s->fwd, s->h, "forward", &wf, err)))
		return rc;
	backward(s->bwd, sh, true);
	if ((rc = plan(s->bwd, s->h, "backward", &wb, err)))
		return rc;
	s->ws = wf > wb ? wf : wb;
	return MS_OK;
}

extern "C" int ms_sdpa_new(const struct ms_flash_shape *sh, struct ms_sdpa **out,
			   struct ms_err *err)
{
	struct ms_sdpa *s = NULL;
	int rc;
	*out = NULL;
	if (!ms_sdpa_version(err))
		return MS_ENODEV;
	if (!sh->B || !sh->S || !sh->nkv || sh->nh % sh->nkv || !sh->hd || sh->hd % 8 ||
	    sh->hd > 256)
		return ms_err_set(err, MS_EINVAL, "cuDNN SDPA: no plan for %u heads / %u KV "
				  "heads of %u", sh->nh, sh->nkv, sh->hd);
	try {
		s = new ms_sdpa();
		s->h = NULL;
		if (fe::detail::create_handle(&s->h) != CUDNN_STATUS_SUCCESS) {
			s->h = NULL;
			rc = ms_err_set(err, MS_EIO, "cuDNN: cudnnCreate failed");
		} else {
			rc = build(s, sh, err);
		}
	} catch (const std::exception &e) {
		rc = ms_err_set(err, MS_EIO, "cuDNN SDPA: %s", e.what());
	}
	if (rc) {
		ms_sdpa_free(s);
		return rc;
	}
	*out = s;
	return MS_OK;
}

extern "C" void ms_sdpa_free(struct ms_sdpa *s)
{
	if (!s)
		return;
	try {
		if (s->h)
			fe::detail::destroy_handle(s->h);
		delete s;
	} catch (...) {
	}
}

extern "C" uint64_t ms_sdpa_workspace_bytes(const struct ms_sdpa *s)
{
	return s ? (uint64_t)s->ws : 0;
}

static int run(struct ms_sdpa *s, fe::graph::Graph &g, const char *which,
	       std::unordered_map<int64_t, void *> &pack, void *ws, void *stream,
	       struct ms_err *err)
{
	try {
		if (fe::detail::set_stream(s->h, (cudaStream_t)stream) != CUDNN_STATUS_SUCCESS)
			return ms_err_set(err, MS_EIO, "cuDNN: cudnnSetStream failed");
		fe::error_t st = g.execute(s->h, pack, ws);
		if (st.is_bad())
			return ms_err_set(err, MS_EIO, "cuDNN SDPA %s: %s", which,
					  st.get_message().c_str());
	} catch (const std::exception &e) {
		return ms_err_set(err, MS_EIO, "cuDNN SDPA %s: %s", which, e.what());
	}
	return MS_OK;
}

extern "C" int ms_sdpa_fwd(struct ms_sdpa *s, const void *q, const void *k, const void *v,
			   void *o, float *lse, void *ws, void *stream, struct ms_err *err)
{
	std::unordered_map<int64_t, void *> pack = {
		{U_Q, (void *)q}, {U_K, (void *)k}, {U_V, (void *)v}, {U_O, o}, {U_LSE, lse}};
	return run(s, s->fwd, "forward", pack, ws, stream, err);
}

extern "C" int ms_sdpa_bwd(struct ms_sdpa *s, const void *q, const void *k, const void *v,
			   const void *o, const void *dout, const float *lse, void *dq, void *dk,
			   void *dv, void *ws, void *stream, struct ms_err *err)
{
	std::unordered_map<int64_t, void *> pack = {
		{U_Q, (void *)q},     {U_K, (void *)k},       {U_V, (void *)v},
		{U_O, (void *)o},     {U_DO, (void *)dout},   {U_LSE, (void *)lse},
		{U_DQ, dq},           {U_DK, dk},             {U_DV, dv}};
	return run(s, s->bwd, "backward", pack, ws, stream, err);
}

#else /* no cuDNN frontend in this build */

extern "C" uint64_t ms_sdpa_version(struct ms_err *err)
{
	ms_err_set(err, MS_ENODEV, "cuDNN: this build has no cuDNN frontend (its headers were "
		   "not fetched)");
	return 0;
}

extern "C" int ms_sdpa_new(const struct ms_flash_shape *sh, struct ms_sdpa **out,
			   struct ms_err *err)
{
	(void)sh;
	*out = NULL;
	ms_sdpa_version(err);
	return MS_ENODEV;
}

extern "C" void ms_sdpa_free(struct ms_sdpa *s)
{
	(void)s;
}

extern "C" uint64_t ms_sdpa_workspace_bytes(const struct ms_sdpa *s)
{
	(void)s;
	return 0;
}

extern "C" int ms_sdpa_fwd(struct ms_sdpa *s, const void *q, const void *k, const void *v,
			   void *o, float *lse, void *ws, void *stream, struct ms_err *err)
{
	(void)s, (void)q, (void)k, (void)v, (void)o, (void)lse, (void)ws, (void)stream;
	return ms_sdpa_version(err) ? MS_EIO : MS_ENODEV;
}

extern "C" int ms_sdpa_bwd(struct ms_sdpa *s, const void *q, const void *k, const void *v,
			   const void *o, const void *dout, const float *lse, void *dq, void *dk,
			   void *dv, void *ws, void *stream, struct ms_err *err)
{
	(void)s, (void)q, (void)k, (void)v, (void)o, (void)dout, (void)lse, (void)dq, (void)dk;
	(void)dv, (void)ws, (void)stream;
	return ms_sdpa_version(err) ? MS_EIO : MS_ENODEV;
}

#endif
