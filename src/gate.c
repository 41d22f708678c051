/*
 * gate.c: verify every state a plan names, then record the run (gate.h).
 */
#include "gate.h"

#include <ctype.h>
#include <errno.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "fsutil.h"
#include "hash.h"
#include "shard.h"
#include "verify.h"

void ms_gate_free(struct ms_gate *g)
{
	if (!g)
		return;
	ms_fp_plan_free(g->plan);
	for (size_t i = 0; i < g->ninputs; i++) {
		ms_free(g->inputs[i].role);
		ms_free(g->inputs[i].label);
		ms_free(g->inputs[i].path);
		ms_free(g->inputs[i].shards);
	}
	ms_free(g->inputs);
	for (size_t i = 0; i < g->nenv; i++)
		ms_free(g->env[i]);
	ms_free(g->env);
	ms_free(g);
}

/* "2026-11-29T10:27:57.123456Z" to nanoseconds since the epoch. */
static int parse_iso(const char *s, int64_t *ns)
{
	struct tm tm = {0};
	long usec = 0;
	char *end;

	end = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm);
	if (!end)
		return -1;
	if (*end == '.') {
		char *e2;

		usec = strtol(end + 1, &e2, 10);
		end = e2;
	}
	if (*end != 'Z')
		return -1;
	*ns = (int64_t)timegm(&tm) * 1000000000 + (int64_t)usec * 1000;
	return 0;
}

/*
 * A verification of digest that started after every file's last change,
 * by a margin: file times come from the kernel's coarse clock (a tick
 * behind the clock the verification time is read from) and some file
 * systems keep whole or even-numbered seconds, so a change made just after
 * a verification can carry an earlier time than the verification itself
 * (git's "racily clean" files). A file changed within RECENT_SLACK_NS of
 * the verification's start is not trusted; it is hashed again. The start
 * (recorded time minus the recorded duration) rules out changes made while
 * the verification read the files.
 */
#define RECENT_SLACK_NS 2000000000LL

static int recent_ok(struct ms_inv *inv, const char *digest, const struct ms_vstate *s)
{
	struct ms_inv_verification *v = NULL;
	struct ms_err err = {0};
	size_t n = 0;
	int64_t at, newest = 0;
	int ok = 0;

	if (ms_inv_verifications(inv, digest, &v, &n, &err) != MS_OK || n == 0)
		goto out;
	if (v[0].result != MS_INV_RESULT_OK || parse_iso(v[0].at, &at))
		goto out;
	at -= (int64_t)(v[0].seconds * 1e9) + RECENT_SLACK_NS;
	for (size_t i = 0; i < s->nfiles; i++) {
		struct stat st;
		int64_t c;

		if (stat(s->files[i].path, &st) || (uint64_t)st.st_size != s->files[i].size)
			goto out;
		c = (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec;
		if ((int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec > c)
			c = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
		if (c > newest)
			newest = c;
	}
	ok = newest < at;
out:
	ms_inv_verifications_free(v, n);
	return ok;
}

static void role_env(const char *role, char *out, size_t n)
{
	size_t k = 0;

	for (; *role && k + 1 < n; role++)
		out[k++] = isalnum((unsigned char)*role) ? (char)toupper((unsigned char)*role) : '_';
	out[k] = 0;
}

static int refuse(struct ms_gate *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int refuse(struct ms_gate *g, const char *fmt, ...)
{
	va_list ap;

	if (g->refused)
		return MS_ECHECK; /* the first reason is the one reported */
	va_start(ap, fmt);
	vsnprintf(g->why, sizeof(g->why), fmt, ap);
	va_end(ap);
	g->refused = 1;
	return MS_ECHECK;
}

/* A plan path that names an EP shard set: a directory holding its
 * manifest, or the manifest itself. */
static int is_shard_set(const char *path)
{
	struct stat st;
	const char *base = ms_path_base(path);
	char *m;
	int yes;

	if (stat(path, &st))
		return 0;
	if (!S_ISDIR(st.st_mode))
		return !strcmp(base, MS_EP_MANIFEST);
	if (!(m = ms_path_join(path, MS_EP_MANIFEST)))
		return 0;
	yes = stat(m, &st) == 0 && S_ISREG(st.st_mode);
	ms_free(m);
	return yes;
}

/*
 * A shard set entry: the whole set is checked (every shard and expert, the
 * manifest); it must be an EP split of the plan's size, and each shard an
 * inventoried state recorded with its rank (a set of unrecorded shards is
 * refused like an unrecorded path). The input's state is the set's source,
 * its path the set's directory, its shards every shard's digest.
 */
static int check_shard_set(struct ms_inv *inv, struct ms_gate *g, struct ms_gate_input *in,
			   const char *where, unsigned flags, int nthreads, struct ms_err *err)
{
	struct ms_shard_opts o;
	struct ms_shard_result *res = NULL;
	struct ms_inv_state *st = NULL;
	struct ms_err lerr = {0};
	const char *role = in->role;
	char *dir = NULL, *real = NULL;
	struct timespec t0, t1;
	int rc;

	memset(&o, 0, sizeof(o));
	o.nthreads = nthreads;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	rc = ms_shard_check(where, &o, &res, &lerr);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (rc == MS_ECHECK || rc == MS_EINVAL || rc == MS_ENOTFOUND) {
		rc = refuse(g, "role '%s': shard set '%s': %s", role, where, lerr.msg);
		goto out;
	}
	if (rc != MS_OK) {
		rc = ms_err_set(err, rc, "role '%s': shard set '%s': %s", role, where, lerr.msg);
		goto out;
	}
	in->seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	for (size_t k = 0; k < res->nfiles; k++)
		in->bytes += res->files[k].nbytes;
	if (res->ep_size != g->plan->ep_size) {
		rc = refuse(g, "role '%s': shard set '%s' is an EP=%u split, the plan runs EP=%u: run "
			    "'msshard reshard %s -o DIR --ep-size %u' and name DIR", role, where,
			    res->ep_size, g->plan->ep_size, where, g->plan->ep_size);
		goto out;
	}
	if (!(in->shards = ms_calloc(res->nfiles ? res->nfiles : 1, sizeof(*in->shards)))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t k = 0; k < res->nfiles; k++) {
		const struct ms_shard_out_file *f = &res->files[k];

		rc = ms_inv_state_get(inv, f->state_digest, &st, &lerr);
		if (rc == MS_ENOTFOUND) {
			rc = refuse(g, "role '%s': '%s' (rank %u of shard set '%s') is state %s, which is "
				    "not in the inventory (add it with msinv add)", role, f->path, f->rank,
				    where, f->state_digest);
			goto out;
		}
		if (rc != MS_OK) {
			rc = ms_err_set(err, rc, "%s", lerr.msg);
			goto out;
		}
		if (st->ep_size >= 0 &&
		    ((uint32_t)st->ep_size != res->ep_size || (uint32_t)st->ep_rank != f->rank)) {
			rc = refuse(g, "role '%s': '%s': the inventory records it as rank %d of %d, the "
				    "shard set says rank %u of %u", role, f->path, st->ep_rank,
				    st->ep_size, f->rank, res->ep_size);
			goto out;
		}
		ms_inv_state_free(st);
		st = NULL;
		memcpy(in->shards[in->nshards++], f->state_digest, MS_STATE_DIGEST_LEN);
	}
	/* the role's state is what the set was split from (recorded or not:
	 * the shards are, and every byte of the set was checked against it) */
	memcpy(in->digest, res->source_digest, MS_STATE_DIGEST_LEN);
	in->kind = res->is_adapter ? MS_INV_KIND_ADAPTER : MS_INV_KIND_BASE;
	in->ep_size = (int32_t)res->ep_size;
	rc = ms_inv_state_get(inv, in->digest, &st, &lerr);
	if (rc == MS_OK) {
		in->kind = st->kind;
		if (st->label && !(in->label = ms_strdup(st->label))) {
			rc = ms_err_nomem(err);
			goto out;
		}
	} else if (rc != MS_ENOTFOUND) {
		rc = ms_err_set(err, rc, "%s", lerr.msg);
		goto out;
	}
	ms_inv_state_free(st);
	st = NULL;
	dir = ms_strdup(res->manifest_path);
	if (dir) {
		char *slash = strrchr(dir, '/');

		if (slash)
			*(slash == dir ? slash + 1 : slash) = 0;
		else
			strcpy(dir, ".");
	}
	if (!dir || !(real = realpath(dir, NULL)) || !(in->path = ms_strdup(real))) {
		rc = !dir || real ? ms_err_nomem(err)
				  : ms_err_set(err, MS_EIO, "'%s': %s", dir, strerror(errno));
		goto out;
	}
	rc = MS_OK;
	for (size_t k = 0; k < in->nshards && !(flags & MS_GATE_DRY_RUN) && rc == MS_OK; k++)
		rc = ms_inv_record_verification(inv, in->shards[k], MS_INV_RESULT_OK, res->files[k].nbytes,
						in->seconds, NULL, err);
out:
	free(real);
	ms_free(dir);
	ms_inv_state_free(st);
	ms_shard_result_free(res);
	return rc;
}

/* Verify one plan entry into g->inputs[i]; refusals go to g, failures of
 * the check itself to err. */
static int check_entry(struct ms_inv *inv, struct ms_gate *g, size_t i, unsigned flags,
		       int nthreads, struct ms_err *err)
{
	const struct ms_fp_entry *e = &g->plan->entries[i];
	struct ms_gate_input *in = &g->inputs[i];
	struct ms_inv_state *st = NULL;
	struct ms_vstate *vs = NULL;
	struct ms_ckpt *ck = NULL;
	struct ms_err lerr = {0};
	int rc;

	if (!(in->role = ms_strdup(e->role)))
		return ms_err_nomem(err);
	in->ep_size = in->ep_rank = -1;
	if (e->state) {
		rc = ms_inv_resolve(inv, e->state, in->digest, &lerr);
		if (rc == MS_ENOTFOUND || rc == MS_EINVAL)
			return refuse(g, "role '%s': %s", e->role, lerr.msg);
		if (rc != MS_OK)
			return ms_err_set(err, rc, "%s", lerr.msg);
	} else {
		/* a path: its bytes are hashed now, so they are verified by
		 * construction; they must be an inventoried state. A relative
		 * path is relative to the plan's directory. */
		const char *base = ms_path_base(g->plan_path);
		char *where = e->path[0] == '/' || base == g->plan_path
				      ? ms_strdup(e->path)
				      : ms_asprintf("%.*s%s", (int)(base - g->plan_path), g->plan_path,
						    e->path);

		if (!where)
			return ms_err_nomem(err);
		if (is_shard_set(where)) {
			rc = check_shard_set(inv, g, in, where, flags, nthreads, err);
			ms_free(where);
			return rc;
		}
		rc = ms_ckpt_open(where, &ck, &lerr);
		if (rc == MS_OK)
			rc = ms_ckpt_hash(ck, nthreads, 0, &lerr);
		if (rc == MS_OK)
			rc = ms_state_digest(ck->tensors, ck->ntensors, in->digest, &lerr);
		if (rc == MS_OK)
			for (size_t f = 0; f < ck->nfiles; f++)
				in->bytes += ck->files[f]->size;
		ms_ckpt_close(ck);
		if (rc == MS_EINVAL || rc == MS_ENOTFOUND || rc == MS_ECHECK) {
			ms_free(where);
			return refuse(g, "role '%s': %s", e->role, lerr.msg);
		}
		if (rc != MS_OK) {
			ms_free(where);
			return ms_err_set(err, rc, "role '%s': %s", e->role, lerr.msg);
		}
		{
			char *real = realpath(where, NULL);

			if (!real || !(in->path = ms_strdup(real))) {
				rc = real ? ms_err_nomem(err)
					  : ms_err_set(err, MS_EIO, "'%s': %s", where, strerror(errno));
				free(real);
				ms_free(where);
				return rc;
			}
			free(real);
		}
		ms_free(where);
	}
	rc = ms_inv_state_get(inv, in->digest, &st, &lerr);
	if (rc == MS_ENOTFOUND)
		return refuse(g, "role '%s': '%s' is state %s, which is not in the inventory (add it with msinv add)",
			      e->role, e->path ? e->path : e->state, in->digest);
	if (rc != MS_OK)
		return ms_err_set(err, rc, "%s", lerr.msg);
	in->kind = st->kind;
	in->ep_size = st->ep_size;
	in->ep_rank = st->ep_rank;
	if (st->label && !(in->label = ms_strdup(st->label))) {
		ms_inv_state_free(st);
		return ms_err_nomem(err);
	}
	ms_inv_state_free(st);
	if (in->kind == MS_INV_KIND_ADAPTER_SHARD && in->ep_size >= 0 &&
	    (uint32_t)in->ep_size != g->plan->ep_size)
		return refuse(g,
			      "role '%s': state %.23s... is a shard of an EP=%d split, the plan runs EP=%u: run 'msshard reshard --ep-size %u' and add the result",
			      e->role, in->digest, in->ep_size, g->plan->ep_size, g->plan->ep_size);
	if (!e->state)
		return MS_OK;

	if ((rc = ms_vstate_from_inv(inv, in->digest, 0, &vs, err)) != MS_OK)
		return rc;
	if (!(in->path = ms_vstate_location(vs))) {
		ms_vstate_free(vs);
		return ms_err_nomem(err);
	}
	if ((flags & MS_GATE_TRUST_RECENT) && recent_ok(inv, in->digest, vs)) {
		in->trusted = 1;
		ms_vstate_free(vs);
		return MS_OK;
	}
	{
		struct ms_vreport r;

		/* a mismatch refuses the run even when recording it failed: the
		 * verdict is what matters, the record is best effort */
		rc = ms_verify_record(inv, in->digest, vs,
				      (flags & MS_GATE_DRY_RUN) ? MS_VERIFY_NO_RECORD : 0u, nthreads,
				      &r, NULL, err);
		in->bytes = r.bytes;
		in->seconds = r.seconds;
		if (r.nproblems) {
			const struct ms_vproblem *p = &r.problems[0];

			if (p->tensor)
				rc = refuse(g, "role '%s': state %.23s...: tensor '%s' in '%s': %s", e->role,
					    in->digest, p->tensor, p->file, p->detail);
			else
				rc = refuse(g, "role '%s': state %.23s...: '%s': %s", e->role, in->digest,
					    p->file ? p->file : "-", p->detail);
		} else if (rc != MS_OK && rc != MS_ENOMEM) {
			/* the check itself failed (a read, a map): no verdict */
			ms_err_prefix(err, "role '%s': state %.23s...", e->role, in->digest);
		}
		ms_vreport_release(&r);
	}
	ms_vstate_free(vs);
	return rc;
}

static int env_add(struct ms_gate *g, const char *name, const char *value)
{
	char **ne = ms_realloc(g->env, (g->nenv + 2) * sizeof(*ne));

	if (!ne)
		return MS_ENOMEM;
	g->env = ne;
	if (!(ne[g->nenv] = ms_asprintf("%s=%s", name, value)))
		return MS_ENOMEM;
	g->nenv++;
	ne[g->nenv] = NULL;
	return MS_OK;
}

static int build_env(struct ms_inv *inv, struct ms_gate *g)
{
	char num[32], name[128];
	char *abs_plan = realpath(g->plan_path, NULL);
	int rc = MS_OK;

	rc |= env_add(g, "MSINV_DB", ms_inv_path(inv));
	snprintf(num, sizeof(num), "%lld", (long long)g->run_id);
	rc |= env_add(g, "MSINV_RUN", num);
	rc |= env_add(g, "MSINV_PLAN", abs_plan ? abs_plan : g->plan_path);
	free(abs_plan);
	rc |= env_add(g, "MSINV_PLAN_DIGEST", g->plan_digest);
	snprintf(num, sizeof(num), "%u", g->plan->ep_size);
	rc |= env_add(g, "MSINV_EP_SIZE", num);
	if (g->plan->outputs)
		rc |= env_add(g, "MSINV_OUTPUTS", g->plan->outputs);
	for (size_t i = 0; i < g->ninputs; i++) {
		char role[96];

		role_env(g->inputs[i].role, role, sizeof(role));
		snprintf(name, sizeof(name), "MSINV_STATE_%s", role);
		rc |= env_add(g, name, g->inputs[i].digest);
		snprintf(name, sizeof(name), "MSINV_PATH_%s", role);
		rc |= env_add(g, name, g->inputs[i].path ? g->inputs[i].path : "");
	}
	return rc ? MS_ENOMEM : MS_OK;
}

/* The states a run consumes: every input's, and every shard of a shard
 * set input (with known only those in the inventory: a refused run may
 * name what is not, and a shard set's source need not be recorded, its
 * shards are). *ins is owned by the caller; its strings are g's. */
static int run_inputs(struct ms_inv *inv, const struct ms_gate *g, int known,
		      struct ms_inv_run_input **ins, size_t *n)
{
	size_t cap = 1, k = 0;

	for (size_t i = 0; i < g->ninputs; i++)
		cap += 1 + g->inputs[i].nshards;
	if (!(*ins = ms_calloc(cap, sizeof(**ins))))
		return MS_ENOMEM;
	for (size_t i = 0; i < g->ninputs; i++) {
		const struct ms_gate_input *in = &g->inputs[i];

		for (size_t s = 0; s <= in->nshards; s++) {
			const char *d = s ? in->shards[s - 1] : in->digest;
			struct ms_inv_state *st = NULL;
			struct ms_err lerr = {0};
			int dup = 0;

			if (!d[0])
				continue;
			if (known) {
				if (ms_inv_state_get(inv, d, &st, &lerr) != MS_OK)
					continue;
				ms_inv_state_free(st);
			}
			/* one row per digest: two roles may name one state */
			for (size_t j = 0; j < k && !dup; j++)
				dup = !strcmp((*ins)[j].digest, d);
			if (dup)
				continue;
			(*ins)[k].digest = d;
			(*ins)[k++].role = in->role;
		}
	}
	*n = k;
	return MS_OK;
}

/* The run of a refused or failed launch: recorded as failed with the exit
 * status the launcher exits with (exit_code: 1 refused, 2 or 3 for a check
 * that could not be made; the command never ran) and an event saying why,
 * naming the states the plan could name; one batch, so the run, its event
 * and its end are recorded together or not at all. */
static int record_no_run(struct ms_inv *inv, struct ms_gate *g, const char *kind,
			 const char *why, int exit_code, struct ms_err *err)
{
	struct ms_inv_run_input *ins = NULL;
	cJSON *ev = NULL;
	char *js = NULL;
	size_t k = 0;
	int rc, batch = 0;

	if (run_inputs(inv, g, 1, &ins, &k) != MS_OK) {
		rc = ms_err_nomem(err);
		goto out;
	}
	if ((rc = ms_inv_batch_begin(inv, err)) != MS_OK)
		goto out;
	batch = 1;
	if ((rc = ms_inv_run_begin(inv, g->plan_digest, ins, k, &g->run_id, err)) != MS_OK)
		goto out;
	ev = cJSON_CreateObject();
	if (!ev || !cJSON_AddStringToObject(ev, "why", why) ||
	    !cJSON_AddStringToObject(ev, "plan", g->plan_path) ||
	    !(js = cJSON_PrintUnformatted(ev))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	if ((rc = ms_inv_event_add(inv, g->run_id, kind, js, NULL, err)) == MS_OK)
		rc = ms_inv_run_end(inv, g->run_id, exit_code, err);
out:
	if (batch) {
		int brc = ms_inv_batch_end(inv, rc == MS_OK, rc == MS_OK ? err : NULL);

		if (rc == MS_OK)
			rc = brc;
		if (rc != MS_OK)
			g->run_id = 0;
	}
	cJSON_Delete(ev);
	cJSON_free(js);
	ms_free(ins);
	return rc;
}

int ms_gate_check(struct ms_inv *inv, const char *plan_path, unsigned flags, int nthreads,
		  struct ms_gate **out, struct ms_err *err)
{
	struct ms_gate *g = ms_calloc(1, sizeof(*g));
	struct ms_inv_run_input *ins = NULL;
	char *text = NULL;
	size_t len, nins = 0;
	uint8_t d[32];
	int rc, failed = MS_OK;

	*out = NULL;
	if (!g)
		return ms_err_nomem(err);
	snprintf(g->plan_path, sizeof(g->plan_path), "%s", plan_path);
	/* one read: the digest recorded is that of the bytes parsed */
	if ((rc = ms_file_read(plan_path, MS_FP_MAX_PLAN, &text, &len, err)) != MS_OK)
		goto fail;
	if ((rc = ms_sha256(text, len, d)) != MS_OK) {
		if (rc == MS_ENOMEM)
			ms_err_set(err, rc, "out of memory");
		else
			ms_err_set(err, rc, "'%s': sha256 failed", plan_path);
		goto fail;
	}
	memcpy(g->plan_digest, "sha256:", 7);
	ms_hex(d, 32, g->plan_digest + 7);
	if ((rc = ms_fp_plan_parse(text, len, plan_path, &g->plan, err)) != MS_OK)
		goto fail;
	g->inputs = ms_calloc(g->plan->nentries + 1, sizeof(*g->inputs));
	if (!g->inputs) {
		rc = ms_err_nomem(err);
		goto fail;
	}
	for (size_t i = 0; i < g->plan->nentries; i++) {
		g->ninputs++;
		rc = check_entry(inv, g, i, flags, nthreads, err);
		if (rc != MS_OK && rc != MS_ECHECK) {
			/* the check could not be made: no verdict on this state */
			failed = rc;
			break;
		}
	}
	if (flags & MS_GATE_DRY_RUN) {
		if (failed != MS_OK && !g->refused) {
			rc = failed;
			goto fail;
		}
		*out = g;
		ms_free(text);
		return g->refused ? MS_ECHECK : MS_OK;
	}
	if (g->refused) {
		/* a difference found is the verdict, whatever failed after it */
		if ((rc = record_no_run(inv, g, "launch_refused", g->why, ms_exit_code(MS_ECHECK),
					err)) != MS_OK)
			goto fail;
		ms_free(text);
		*out = g;
		return MS_ECHECK;
	}
	if (failed != MS_OK) {
		/* recorded when it can be, with the reason; the failure is
		 * what the caller hears about either way */
		struct ms_err lerr = {0};

		(void)record_no_run(inv, g, "launch_failed", err ? err->msg : ms_rc_str(failed),
				    ms_exit_code(failed), &lerr);
		rc = failed;
		goto fail;
	}
	/* record the run, with the states it consumes */
	if (run_inputs(inv, g, 1, &ins, &nins) != MS_OK) {
		rc = ms_err_nomem(err);
		goto fail;
	}
	if ((rc = ms_inv_run_begin(inv, g->plan_digest, ins, nins, &g->run_id, err)) != MS_OK)
		goto fail;
	if (build_env(inv, g) != MS_OK) {
		rc = ms_err_nomem(err);
		goto fail;
	}
	ms_free(ins);
	ms_free(text);
	*out = g;
	return MS_OK;
fail:
	ms_free(ins);
	ms_free(text);
	ms_gate_free(g);
	return rc;
}

int ms_gate_end(struct ms_inv *inv, struct ms_gate *g, int exit_code, struct ms_err *err)
{
	if (!g->run_id)
		return MS_OK;
	return ms_inv_run_end(inv, g->run_id, exit_code, err);
}
