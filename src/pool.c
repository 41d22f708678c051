/*
 * pool.c: the worker pool (pool.h). A mutex hands out job indexes and
 * keeps the first failure; jobs are coarse (a tensor, a file, a span of
 * megabytes), so one lock per job costs nothing.
 */
#include "pool.h"

#include <string.h>
#include <time.h>

static void pool_fail(struct ms_pool *p, int rc, const struct ms_err *err)
{
	pthread_mutex_lock(&p->lock);
	if (p->rc == MS_OK) {
		p->rc = rc;
		p->err = *err;
	}
	pthread_mutex_unlock(&p->lock);
}

static void pool_work(struct ms_pool *p)
{
	uint8_t *scratch = NULL;
	struct ms_err err = { 0 };

	if (p->scratch && !(scratch = ms_malloc(p->scratch))) {
		pool_fail(p, ms_err_nomem(&err), &err);
		return;
	}
	for (;;) {
		size_t i;
		int rc;

		pthread_mutex_lock(&p->lock);
		i = p->next < p->njobs && p->rc == MS_OK ? p->next++ : SIZE_MAX;
		pthread_mutex_unlock(&p->lock);
		if (i == SIZE_MAX)
			break;
		if ((rc = p->run(p, i, scratch, &err)) != MS_OK)
			pool_fail(p, rc, &err);
	}
	ms_free(scratch);
}

static void *pool_thread(void *arg)
{
	struct ms_pool *p = arg;

	pool_work(p);
	__atomic_sub_fetch(&p->running, 1, __ATOMIC_RELEASE);
	return NULL;
}

int ms_pool_stopping(struct ms_pool *p)
{
	int rc;

	pthread_mutex_lock(&p->lock);
	rc = p->rc;
	pthread_mutex_unlock(&p->lock);
	return rc != MS_OK;
}

int ms_pool_run(struct ms_pool *p, struct ms_err *err)
{
	pthread_t *th = NULL;
	int nth = p->nthreads > 0 ? p->nthreads : ms_ncpus();
	int report = p->report != NULL, started = 0, rc = MS_OK;

	if ((size_t)nth > p->njobs)
		nth = p->njobs ? (int)p->njobs : 1;
	p->next = 0;
	p->rc = MS_OK;
	memset(&p->err, 0, sizeof(p->err));
	if (!(th = ms_malloc((size_t)nth * sizeof(*th))))
		return ms_err_nomem(err);
	pthread_mutex_init(&p->lock, NULL);
	/* the caller is one of the workers, or, reporting, waits for nth others */
	p->running = nth;
	for (int i = report ? 0 : 1; i < nth; i++) {
		if (pthread_create(&th[i], NULL, pool_thread, p)) {
			__atomic_sub_fetch(&p->running, nth - i, __ATOMIC_RELAXED);
			break;
		}
		started = i + 1;
	}
	if (!report || started == 0) {
		pool_work(p);
	} else {
		struct timespec ts = { 0, 200 * 1000 * 1000 };

		while (__atomic_load_n(&p->running, __ATOMIC_ACQUIRE) > 0) {
			p->report(p);
			nanosleep(&ts, NULL);
		}
	}
	for (int i = report ? 0 : 1; i < started; i++)
		pthread_join(th[i], NULL);
	if (report)
		p->report(p);
	pthread_mutex_destroy(&p->lock);
	if (p->rc != MS_OK) {
		rc = p->rc;
		if (err)
			*err = p->err;
	}
	ms_free(th);
	return rc;
}
