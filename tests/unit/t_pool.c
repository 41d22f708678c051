/*
 * t_pool.c: the worker pool (pool.h) that hashing, OMS file hashing, the
 * sharding work and the fast NVFP4 codec run on: every job runs exactly
 * once whatever the thread count, each with a scratch buffer of its own
 * size, the first failure's code and message come back and stop the
 * jobs not yet taken, and a reporting caller reports at least once after
 * the last job is done.
 */
#include "test.h"
#include "pool.h"

#define NJOBS 2000

struct ctx {
	int runs[NJOBS];        /* atomic: times each job ran */
	size_t fail_at;         /* SIZE_MAX: none */
	size_t scratch;
	int bad_scratch;        /* atomic */
	int reports;
	int ran_at_last_report;
};

static int job(struct ms_pool *p, size_t i, uint8_t *scratch, struct ms_err *err)
{
	struct ctx *c = p->ctx;

	__atomic_add_fetch(&c->runs[i], 1, __ATOMIC_RELAXED);
	if (c->scratch) {
		/* the whole buffer is this thread's: fill and check it */
		if (!scratch) {
			__atomic_add_fetch(&c->bad_scratch, 1, __ATOMIC_RELAXED);
		} else {
			memset(scratch, (int)(i & 0xff), c->scratch);
			for (size_t k = 0; k < c->scratch; k++)
				if (scratch[k] != (uint8_t)(i & 0xff)) {
					__atomic_add_fetch(&c->bad_scratch, 1, __ATOMIC_RELAXED);
					break;
				}
		}
	}
	if (i == c->fail_at)
		return ms_err_set(err, MS_EIO, "job %zu failed", i);
	return MS_OK;
}

static void report(struct ms_pool *p)
{
	struct ctx *c = p->ctx;
	int ran = 0;

	for (size_t i = 0; i < NJOBS; i++)
		ran += __atomic_load_n(&c->runs[i], __ATOMIC_RELAXED);
	c->reports++;
	c->ran_at_last_report = ran;
}

static int test_every_job_once(void)
{
	static const int threads[] = { 1, 2, 3, 8, 0 };

	for (size_t t = 0; t < sizeof(threads) / sizeof(threads[0]); t++) {
		static struct ctx c;
		struct ms_pool p = { .njobs = NJOBS, .nthreads = threads[t], .scratch = 4096,
				     .run = job, .ctx = &c };
		struct ms_err err = { 0 };

		memset(&c, 0, sizeof(c));
		c.fail_at = SIZE_MAX;
		c.scratch = p.scratch;
		T_ASSERT_EQ_INT(ms_pool_run(&p, &err), MS_OK);
		for (size_t i = 0; i < NJOBS; i++)
			T_ASSERT_MSG(c.runs[i] == 1, "%d threads: job %zu ran %d times", threads[t], i,
				     c.runs[i]);
		T_ASSERT_EQ_INT(c.bad_scratch, 0);
	}
	return 0;
}

static int test_first_failure_stops(void)
{
	static struct ctx c;
	struct ms_pool p = { .njobs = NJOBS, .nthreads = 1, .run = job, .ctx = &c };
	struct ms_err err = { 0 };
	int ran = 0;

	memset(&c, 0, sizeof(c));
	c.fail_at = 10;
	T_ASSERT_EQ_INT(ms_pool_run(&p, &err), MS_EIO);
	T_ASSERT_EQ_INT(err.code, MS_EIO);
	T_ASSERT_STR(err.msg, "job 10 failed");
	T_ASSERT(ms_pool_stopping(&p));
	for (size_t i = 0; i < NJOBS; i++)
		ran += c.runs[i];
	/* one thread takes jobs in order: nothing after the failure ran */
	T_ASSERT_EQ_INT(ran, 11);

	/* several threads: the failure still comes back, and no job twice */
	memset(&c, 0, sizeof(c));
	c.fail_at = 500;
	p.nthreads = 4;
	memset(&err, 0, sizeof(err));
	T_ASSERT_EQ_INT(ms_pool_run(&p, &err), MS_EIO);
	T_ASSERT_STR(err.msg, "job 500 failed");
	for (size_t i = 0; i < NJOBS; i++)
		T_ASSERT(c.runs[i] <= 1);
	return 0;
}

static int test_report(void)
{
	static struct ctx c;
	struct ms_pool p = { .njobs = NJOBS, .nthreads = 3, .run = job, .report = report,
			     .ctx = &c };
	struct ms_err err = { 0 };

	memset(&c, 0, sizeof(c));
	c.fail_at = SIZE_MAX;
	T_ASSERT_EQ_INT(ms_pool_run(&p, &err), MS_OK);
	T_ASSERT(c.reports >= 1);
	T_ASSERT_EQ_INT(c.ran_at_last_report, NJOBS);
	return 0;
}

static int test_no_jobs(void)
{
	static struct ctx c;
	struct ms_pool p = { .njobs = 0, .nthreads = 4, .scratch = 64, .run = job, .ctx = &c };
	struct ms_err err = { 0 };

	memset(&c, 0, sizeof(c));
	T_ASSERT_EQ_INT(ms_pool_run(&p, &err), MS_OK);
	return 0;
}

static const struct t_case cases[] = {
	T_CASE(test_every_job_once),
	T_CASE(test_first_failure_stops),
	T_CASE(test_report),
	T_CASE(test_no_jobs),
};

T_MAIN(cases)
