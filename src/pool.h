/*
 * pool.h: the library's one pool of worker threads (as zstd's pool.c):
 * run jobs 0..njobs-1 on a number of threads, the caller among them, each
 * thread with a scratch buffer of its own; the first failure stops the
 * rest. Jobs are taken in index order, so a caller that wants the largest
 * first (one huge tensor must not start last) orders its jobs so.
 *
 * With a report function the calling thread does not work: it calls
 * report every 200 ms while the others work and once when they are done
 * (a progress line). If no thread can be started the caller works alone.
 */
#ifndef MS_POOL_H
#define MS_POOL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"

struct ms_pool {
	/* set by the caller */
	size_t njobs;
	int nthreads;         /* threads that work, at most njobs; <= 0: one per CPU */
	size_t scratch;       /* bytes of each worker's buffer; 0: none (NULL) */
	/* job i: MS_OK, or an MS_E* code with its message in err */
	int (*run)(struct ms_pool *p, size_t i, uint8_t *scratch, struct ms_err *err);
	void (*report)(struct ms_pool *p);   /* NULL: none, the caller works */
	void *ctx;                           /* the caller's, for run and report */
	/* the pool's */
	pthread_mutex_t lock;
	size_t next;
	int running;          /* workers not finished (atomic) */
	int rc;               /* the first failure */
	struct ms_err err;
};

/* Run p's jobs. Returns MS_OK, or the first failure's code with its
 * message in err (MS_ENOMEM "out of memory" when a thread's scratch buffer
 * or the thread table could not be allocated). */
int ms_pool_run(struct ms_pool *p, struct ms_err *err);

/* A job has failed: a long job may end early (its result is not used). */
int ms_pool_stopping(struct ms_pool *p);

#endif
