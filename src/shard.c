/*
 * shard.c: the sharding operations: split, reshard and merge, each written
 * into a staging directory and published in one step (shard.h; the model
 * they share is described in shard_int.h).
 */
#include "shard_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <regex.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "fsutil.h"
#include "hash.h"
#include "inventory.h"
#include "names.h"
#include "safetensors.h"
#include "stage.h"

/* ---- staging and publication ----------------------------------------------- */

/* What these commands write into an output directory: safetensors files,
 * JSON (configs, index, manifest) and, from a killed run, temporaries. */
static int own_entry(int dfd, const char *name)
{
	size_t l = strlen(name);
	struct stat st;

	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode))
		return 0;
	if (name[0] == '.')
		return strstr(name, MS_TMP_MARKER) != NULL;
	return (l > 12 && !strcmp(name + l - 12, ".safetensors")) ||
	       (l > 5 && !strcmp(name + l - 5, ".json"));
}

/* May the existing directory dir be replaced? Sets st->existed. */
static int stage_check_existing(struct stage *st, const char *dir, struct ms_err *err)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	char *foreign = NULL;
	int empty = 1, rc = MS_OK;

	if (!d)
		return ms_err_set(err, MS_EIO, "'%s': cannot read directory: %s", dir,
				  strerror(errno));
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		empty = 0;
		if (!own_entry(dirfd(d), de->d_name)) {
			foreign = ms_strdup(de->d_name);
			if (!foreign)
				rc = ms_err_nomem(err);
			break;
		}
	}
	closedir(d);
	if (rc != MS_OK)
		return rc;
	if (!empty && !st->force)
		rc = ms_err_set(err, MS_EEXIST, "'%s': output exists (use --force to replace it)",
				dir);
	else if (foreign)
		rc = ms_err_set(err, MS_EEXIST, "'%s': exists and holds '%s', which is not a file a "
				"split, merge or reshard writes: not replacing it", dir, foreign);
	ms_free(foreign);
	st->existed = rc == MS_OK;
	return rc;
}

static void stage_init(struct stage *st)
{
	memset(st, 0, sizeof(*st));
	ms_stage_init(&st->s);
}

/* Lock dir's parent, check what dir holds and make the staging directory
 * beside it. */
static int stage_open(struct stage *st, const char *dir, int force, struct ms_err *err)
{
	struct stat sb;
	int rc;

	st->force = force;
	if ((rc = ms_stage_open(&st->s, dir, "output", MS_STAGE_DIR | MS_STAGE_LOCK | MS_STAGE_MKDIR,
				err)) != MS_OK)
		return rc;
	if (lstat(st->s.dest, &sb) == 0) {
		if (!S_ISDIR(sb.st_mode))
			return ms_err_set(err, MS_EEXIST, "'%s': exists and is not a directory", dir);
		return stage_check_existing(st, st->s.dest, err);
	}
	if (errno != ENOENT)
		return ms_err_set(err, MS_EIO, "'%s': %s", dir, strerror(errno));
	return MS_OK;
}

/* Where a file of the output is written before publication. */
static char *stage_path(const struct stage *st, const char *name)
{
	return ms_path_join(ms_stage_path(&st->s), name);
}

/* Remove what is left unpublished (putting back what a publication that
 * was not recorded replaced), unlock. */
static void stage_release(struct stage *st)
{
	ms_stage_abort(&st->s);
}

/* Messages name the output, not its staging directory. */
static void stage_fix_msg(const struct stage *st, struct ms_err *err)
{
	ms_stage_fix_msg(&st->s, err);
}

/*
 * Publish the staged output and let the caller record it (o->publish):
 * when that fails, its error is returned and stage_release takes the
 * output away again and puts back what it replaced. Then what it replaced
 * is removed.
 */
static int stage_commit(struct stage *st, const struct ms_shard_result *res,
			const struct ms_shard_opts *o, struct ms_err *err)
{
	enum ms_stage_how how = !st->existed ? MS_STAGE_NEW
			      : !st->force   ? MS_STAGE_OVER_EMPTY
					     : MS_STAGE_REPLACE;
	int rc;

	if ((rc = ms_stage_publish(&st->s, how, err)) != MS_OK)
		return rc;
	if (o->publish && (rc = o->publish(o->publish_ctx, res, err)) != MS_OK)
		return rc;
	ms_stage_commit(&st->s);
	return MS_OK;
}

/* ---- split ------------------------------------------------------------------ */

/* Parse "<stem>-ep<rank:05d>-of-<n:05d>.safetensors"; 0 when name is not one. */
static int parse_shard_name(const char *name, char *stem, size_t stemsz, uint32_t *rank,
			    uint32_t *n)
{
	const char *suffix = ".safetensors", *p;
	size_t l = strlen(name), sl = strlen(suffix);
	int32_t v1, v2;

	/* "-epDDDDD-of-DDDDD" is 17 bytes */
	if (l < sl + 18 || strcmp(name + l - sl, suffix))
		return 0;
	p = name + l - sl - 17;
	if (strncmp(p, "-ep", 3) || strncmp(p + 8, "-of-", 4))
		return 0;
	for (int i = 0; i < 5; i++)
		if (p[3 + i] < '0' || p[3 + i] > '9' || p[12 + i] < '0' || p[12 + i] > '9')
			return 0;
	v1 = (int32_t)strtol(p + 3, NULL, 10);
	v2 = (int32_t)strtol(p + 12, NULL, 10);
	if ((size_t)(p - name) >= stemsz)
		return 0;
	memcpy(stem, name, (size_t)(p - name));
	stem[p - name] = '\0';
	*rank = (uint32_t)v1;
	*n = (uint32_t)v2;
	return 1;
}

/* A shard file in dir that does not belong to the set (stem, n). */
int shard_foreign_shard(const char *dir, const char *stem, uint32_t n, char **found,
			uint32_t *found_n, struct ms_err *err)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	int rc = MS_OK;

	*found = NULL;
	if (!d) {
		if (errno == ENOENT)
			return MS_OK;
		return ms_err_set(err, MS_EIO, "'%s': cannot read directory: %s", dir, strerror(errno));
	}
	while ((de = readdir(d))) {
		char st[256];
		uint32_t r, m;

		if (de->d_name[0] == '.' || !parse_shard_name(de->d_name, st, sizeof(st), &r, &m))
			continue;
		if (m != n || strcmp(st, stem)) {
			if (!(*found = ms_path_join(dir, de->d_name)))
				rc = ms_err_nomem(err);
			*found_n = m;
			break;
		}
	}
	closedir(d);
	return rc;
}

/* What split_src plans for each of the n shards: its staging path, its
 * metadata and the strings they point to, its experts' local positions and
 * what it holds (os). */
struct split_plan {
	uint32_t n;
	size_t nmeta;                 /* metadata entries per shard */
	struct ms_st_meta *meta;      /* [n * nmeta] */
	char **strs;                  /* [2n] each shard's rank and expert list */
	char **spaths;                /* [n] staging paths (NULL in a dry run) */
	int32_t *lpos;                /* [n * E] */
	struct outspec *os;           /* [n] */
	char num[16], size_s[16], e_s[16];
};

static void split_plan_release(struct split_plan *sp)
{
	for (uint32_t r = 0; sp->strs && r < 2 * sp->n; r++)
		ms_free(sp->strs[r]);
	for (uint32_t r = 0; sp->spaths && r < sp->n; r++)
		ms_free(sp->spaths[r]);
	ms_free(sp->strs);
	ms_free(sp->spaths);
	ms_free(sp->os);
	ms_free(sp->meta);
	ms_free(sp->lpos);
}

/* Plan the shards of s under placement pl: each one's path in fdir (and
 * in the staging directory st unless a dry run), its experts and its
 * metadata (the source's, and what the shard is), and count what it will
 * hold into res. */
static int plan_shards(const struct src *s, const struct ms_ep_placement *pl, const char *fdir,
		       const struct stage *st, const struct ms_shard_opts *o,
		       struct ms_shard_result *res, struct split_plan *sp, struct ms_err *err)
{
	const struct sfile *f0 = s->nfiles ? &s->files[0] : NULL;
	uint32_t n = pl->ep_size;
	size_t nbase = 0;
	int rc = MS_OK;

	sp->n = n;
	/* Each shard keeps the source's metadata and says what it is. */
	for (size_t k = 0; f0 && k < f0->nmeta; k++)
		nbase += strncmp(f0->meta[k].key, META_PREFIX, strlen(META_PREFIX)) != 0;
	sp->nmeta = nbase + 7;
	sp->meta = ms_calloc((size_t)n * sp->nmeta, sizeof(*sp->meta));
	sp->strs = ms_calloc((size_t)n * 2, sizeof(*sp->strs));
	sp->spaths = ms_calloc(n, sizeof(*sp->spaths));
	sp->lpos = ms_malloc((size_t)n * s->E * sizeof(*sp->lpos));
	sp->os = ms_calloc(n, sizeof(*sp->os));
	if (!sp->meta || !sp->strs || !sp->spaths || !sp->lpos || !sp->os) {
		rc = ms_err_nomem(err);
		goto out;
	}
	snprintf(sp->size_s, sizeof(sp->size_s), "%u", n);
	snprintf(sp->e_s, sizeof(sp->e_s), "%u", s->E);
	snprintf(sp->num, sizeof(sp->num), "%d", MS_EP_MANIFEST_VERSION);
	for (uint32_t r = 0; r < n; r++) {
		struct ms_shard_out_file *f = &res->files[r];
		struct ms_st_meta *m = sp->meta + (size_t)r * sp->nmeta;
		int32_t *lp = sp->lpos + (size_t)r * s->E;
		char *name = shard_name(shard_stem_of(s), r, n);
		uint32_t l = pl->first[r + 1] - pl->first[r];
		struct ms_buf b;
		size_t k = 0;

		f->path = name ? ms_path_join(fdir, name) : NULL;
		sp->spaths[r] = name && !o->dry_run ? stage_path(st, name) : NULL;
		ms_free(name);
		f->experts = ms_malloc((l ? l : 1) * sizeof(uint32_t));
		if (!f->path || !f->experts || (!o->dry_run && !sp->spaths[r])) {
			rc = ms_err_nomem(err);
			goto out;
		}
		memcpy(f->experts, pl->ids + pl->first[r], l * sizeof(uint32_t));
		f->nexperts = l;
		f->rank = r;
		for (size_t i = 0; f0 && i < f0->nmeta; i++)
			if (strncmp(f0->meta[i].key, META_PREFIX, strlen(META_PREFIX)))
				m[k++] = f0->meta[i];
		ms_buf_init(&b);
		for (uint32_t i = 0; i < f->nexperts; i++)
			ms_buf_printf(&b, i ? ",%u" : "%u", f->experts[i]);
		sp->strs[2 * r] = ms_asprintf("%u", r);
		sp->strs[2 * r + 1] = b.oom ? NULL : b.data ? ms_buf_detach(&b, NULL) : ms_strdup("");
		ms_buf_release(&b);
		if (!sp->strs[2 * r] || !sp->strs[2 * r + 1]) {
			rc = ms_err_nomem(err);
			goto out;
		}
		m[k++] = (struct ms_st_meta){ (char *)META_PREFIX "version", sp->num };
		m[k++] = (struct ms_st_meta){ (char *)META_PREFIX "rank", sp->strs[2 * r] };
		m[k++] = (struct ms_st_meta){ (char *)META_PREFIX "size", sp->size_s };
		m[k++] = (struct ms_st_meta){ (char *)META_PREFIX "num_experts", sp->e_s };
		m[k++] = (struct ms_st_meta){ (char *)META_PREFIX "placement",
					      (char *)ms_ep_placement_name(pl->kind) };
		m[k++] = (struct ms_st_meta){ (char *)META_PREFIX "experts", sp->strs[2 * r + 1] };
		m[k++] = (struct ms_st_meta){ (char *)META_PREFIX "source", (char *)s->digest };
		for (uint32_t e = 0; e < s->E; e++)
			lp[e] = -1;
		for (uint32_t i = 0; i < f->nexperts; i++)
			lp[f->experts[i]] = (int32_t)i;
		sp->os[r] = (struct outspec){ .path = sp->spaths[r], .file = -1, .ids = f->experts,
					      .l = f->nexperts, .lpos = lp, .nmeta = k, .meta = m };
		if ((rc = shard_out_plan(s, &sp->os[r], f, err)) != MS_OK)
			goto out;
	}
out:
	return rc;
}

/* Write the planned shards on the pool: v's first npre jobs (the inputs'
 * faulting in) before them, its other checks after them, so that the
 * shards' fsyncs overlap the checks; then v's check must pass. */
static int split_write(const struct src *s, const struct split_plan *sp,
		       const struct ms_shard_opts *o, const struct vplan *v,
		       struct ms_shard_result *res, struct ms_err *err)
{
	uint32_t n = sp->n;
	size_t nj = (size_t)n + (v ? v->njobs : 0);
	struct job *jobs = NULL;
	struct pool pool;
	int rc;

	if (!(jobs = ms_calloc(nj ? nj : 1, sizeof(*jobs)))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (size_t i = 0; v && i < v->npre; i++)
		jobs[i] = v->jobs[i];
	for (uint32_t r = 0; r < n; r++) {
		jobs[(v ? v->npre : 0) + r].kind = JOB_FILE;
		jobs[(v ? v->npre : 0) + r].file = r;
	}
	for (size_t i = v ? v->npre : 0; v && i < v->njobs; i++)
		jobs[n + i] = v->jobs[i];
	pool = (struct pool){ .jobs = jobs, .njobs = nj, .s = s, .os = sp->os, .files = res->files,
			      .nfiles = n, .o = o };
	if ((rc = shard_pool_run(&pool, o->nthreads, err)) != MS_OK)
		goto out;
	if (v && (rc = v->check(v->ctx, err)) != MS_OK)
		goto out;
out:
	ms_free(jobs);
	return rc;
}

/* The config files, then the manifest last (a set without one is
 * incomplete and is refused), into the staging directory st. */
static int split_write_manifest(const struct src *s, const struct ms_ep_placement *pl,
				const char *fdir, const struct stage *st,
				struct ms_shard_result *res, struct ms_err *err)
{
	char *mtext = NULL, *p = NULL;
	size_t mlen = 0;
	int rc = MS_OK;

	for (size_t c = 0; c < s->nconfigs; c++) {
		if (!(p = stage_path(st, s->configs[c].name))) {
			rc = ms_err_nomem(err);
			goto out;
		}
		rc = ms_file_write_atomic(p, s->configs[c].text, s->configs[c].len, 0, err);
		ms_free(p);
		p = NULL;
		if (rc != MS_OK)
			goto out;
	}
	if ((rc = shard_manifest_text(s, pl, res->files, &mtext, &mlen, err)) != MS_OK)
		goto out;
	if (!(p = stage_path(st, MS_EP_MANIFEST))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	if ((rc = ms_file_write_atomic(p, mtext, mlen, 0, err)) != MS_OK)
		goto out;
	if (!(res->manifest_path = ms_path_join(fdir, MS_EP_MANIFEST)))
		rc = ms_err_nomem(err);
out:
	ms_free(mtext);
	ms_free(p);
	return rc;
}

/*
 * Write s as the shard set of placement pl to dir: the shards, the config
 * files and the manifest (last) into the staging directory st (opened by
 * the caller, unless o->dry_run), published as one step once complete
 * (stage_commit). Without v, s has its digests and expert records
 * computed; with v, its jobs run on the pool beside the writing and
 * v->check must pass before anything is published.
 */
static int split_src(const struct src *s, const struct ms_ep_placement *pl, const char *dir,
		     struct stage *st, const struct ms_shard_opts *o, const struct vplan *v,
		     struct ms_shard_result **out, struct ms_err *err)
{
	struct ms_shard_result *res = NULL;
	struct split_plan sp = { 0 };
	const char *fdir = o->dry_run ? dir : st->s.dest;
	int rc;

	*out = NULL;
	if ((rc = shard_result_new(s, pl, pl->ep_size, &res, err)) != MS_OK ||
	    (rc = plan_shards(s, pl, fdir, st, o, res, &sp, err)) != MS_OK)
		goto out;
	if (!o->dry_run &&
	    ((rc = split_write(s, &sp, o, v, res, err)) != MS_OK ||
	     (rc = split_write_manifest(s, pl, fdir, st, res, err)) != MS_OK ||
	     (rc = stage_commit(st, res, o, err)) != MS_OK))
		goto out;
	*out = res;
	res = NULL;
out:
	split_plan_release(&sp);
	ms_shard_result_free(res);
	return rc;
}

static int same_dir(const char *a, const char *b)
{
	struct stat x, y;

	return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

/* Is dir the directory that holds the file path? */
static int same_parent(const char *path, const char *dir)
{
	struct stat st;
	char *parent;
	const char *slash;
	int same;

	if (stat(path, &st) || S_ISDIR(st.st_mode))
		return 0;
	slash = strrchr(path, '/');
	parent = slash ? ms_strndup(path, (size_t)(slash - path) + (slash == path)) : ms_strdup(".");
	same = parent && same_dir(parent, dir);
	ms_free(parent);
	return same;
}

/*
 * The expert count the tensors were read with against the base model's
 * (o->base_experts; 0: unknown). A fused LoRA's rows are E*r: r in
 * adapter_config.json is what turns them into experts, so a wrong r splits
 * 16 experts into "12" with every shape consistent; only the base can tell.
 * Returns MS_OK, or code with the tensor, the rule and both counts.
 */
int shard_check_base(const struct src *s, const struct ms_shard_opts *o, int code,
		     struct ms_err *err)
{
	const char *bl = o && o->base_label ? o->base_label : "the base";

	if (!o || !o->base_experts || s->E == o->base_experts)
		return MS_OK;
	if (s->e_from)
		return ms_err_set(err, code, "tensor '%s' in '%s': %llu rows at r=%u "
				  "(adapter_config.json) make %u experts, but the base '%s' has %u: "
				  "\"r\" does not fit the fused LoRA's shapes", s->e_from->name, s->label,
				  (unsigned long long)s->e_from->shape[0], s->e_from->r, s->E, bl,
				  o->base_experts);
	return ms_err_set(err, code, "'%s': %u experts, but the base '%s' has %u", s->label, s->E,
			  bl, o->base_experts);
}

int ms_shard_split(const char *src, const char *dir, const struct ms_shard_opts *o,
		   struct ms_shard_result **out, struct ms_err *err)
{
	struct ms_ckpt *c = NULL;
	struct ms_ep_placement *pl = NULL;
	struct stage st;
	struct src s;
	int rc;

	*out = NULL;
	stage_init(&st);
	memset(&s, 0, sizeof(s));
	s.label = src;
	if (same_dir(src, dir) || same_parent(src, dir)) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': split into another directory than its input's",
				dir);
		goto out;
	}
	if ((rc = ms_ckpt_open(src, &c, err)) != MS_OK)
		goto out;
	if ((rc = shard_src_from_ckpt(&s, c, err)) != MS_OK)
		goto out;
	if ((rc = shard_analyze(&s, o->num_experts, "--experts", err)) != MS_OK ||
	    (rc = shard_check_base(&s, o, MS_EINVAL, err)) != MS_OK)
		goto out;
	if ((rc = ms_ep_placement_new(o->placement, s.E, o->ep_size, &pl, err)) != MS_OK)
		goto out;
	if ((rc = shard_src_point_whole(&s, err)) != MS_OK)
		goto out;
	/* an output that may not be replaced is refused before the hashing */
	if (!o->dry_run && (rc = stage_open(&st, dir, o->force, err)) != MS_OK)
		goto out;
	if (!o->dry_run) {
		if ((rc = ms_ckpt_hash(c, o->nthreads, 0, err)) != MS_OK)
			goto out;
		for (size_t i = 0; i < s.n; i++) {
			memcpy(s.t[i].digest, s.t[i].st->digest, MS_SHA256_LEN);
			s.t[i].has_digest = 1;
		}
		if ((rc = shard_src_state_digest(&s, s.digest, err)) != MS_OK ||
		    (rc = shard_hash_records(&s, o->nthreads, err)) != MS_OK)
			goto out;
	}
	rc = split_src(&s, pl, dir, &st, o, NULL, out, err);
out:
	if (rc != MS_OK)
		stage_fix_msg(&st, err);
	/* the lock goes last: the output is complete or removed by now */
	stage_release(&st);
	ms_ep_placement_free(pl);
	shard_src_release(&s);
	ms_ckpt_close(c);
	return rc;
}

/* After the reshard's checking jobs ran beside the writing. */
static int reshard_check(void *ctx, struct ms_err *err)
{
	struct sset *ss = ctx;

	shard_sset_jobs_done(ss, 0);
	return shard_sset_check(ss, 0, err);
}

int ms_shard_reshard(const char *dir, const char *out_dir, const struct ms_shard_opts *o,
		     struct ms_shard_result **out, struct ms_err *err)
{
	struct ms_ep_placement *pl = NULL;
	struct jobs jl = { 0 };
	struct vplan v = { 0 };
	struct stage st;
	struct sset ss;
	int rc;

	*out = NULL;
	stage_init(&st);
	rc = shard_sset_open(dir, -1, 0, 0, 0, o->nthreads, NULL, &ss, err);
	if (rc != MS_OK)
		goto out;
	if (same_dir(ss.dir, out_dir)) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': reshard into another directory than its input",
				out_dir);
		goto out;
	}
	if ((rc = ms_ep_placement_new(o->placement, ss.s.E, o->ep_size, &pl, err)) != MS_OK)
		goto out;
	if (!o->dry_run) {
		if ((rc = stage_open(&st, out_dir, o->force, err)) != MS_OK ||
		    (rc = shard_sset_jobs(&ss, 0, &jl, &v.npre, err)) != MS_OK)
			goto out;
		v.jobs = jl.v;
		v.njobs = jl.n;
		v.check = reshard_check;
		v.ctx = &ss;
	}
	/* The inputs are checked on the pool while the outputs are written
	 * there; nothing is published before the check passed. The expert
	 * digests of the output are the input's, verified. */
	rc = split_src(&ss.s, pl, out_dir, &st, o, o->dry_run ? NULL : &v, out, err);
out:
	if (rc != MS_OK)
		stage_fix_msg(&st, err);
	stage_release(&st);
	shard_jobs_release(&jl);
	ms_ep_placement_free(pl);
	shard_sset_release(&ss);
	return rc;
}

/* A JSON string as Python's json.dumps writes it (ensure_ascii). */
static void py_str(struct ms_buf *b, const char *s)
{
	const unsigned char *p = (const unsigned char *)s;

	ms_buf_puts(b, "\"");
	while (*p) {
		uint32_t cp = *p;
		size_t len = 1;

		if (cp >= 0x80) {
			/* decode UTF-8; a malformed byte is copied as it is */
			len = cp >= 0xf0 ? 4 : cp >= 0xe0 ? 3 : cp >= 0xc0 ? 2 : 1;
			cp &= len == 4 ? 0x07 : len == 3 ? 0x0f : 0x1f;
			for (size_t i = 1; i < len; i++) {
				if ((p[i] & 0xc0) != 0x80) {
					len = 0;
					break;
				}
				cp = (cp << 6) | (p[i] & 0x3f);
			}
			if (len < 2) {
				ms_buf_append(b, p, 1);
				p++;
				continue;
			}
			if (cp >= 0x10000) {
				cp -= 0x10000;
				ms_buf_printf(b, "\\u%04x\\u%04x", 0xd800 + (cp >> 10),
					      0xdc00 + (cp & 0x3ff));
			} else {
				ms_buf_printf(b, "\\u%04x", cp);
			}
			p += len;
			continue;
		}
		switch (cp) {
		case '"': ms_buf_puts(b, "\\\""); break;
		case '\\': ms_buf_puts(b, "\\\\"); break;
		case '\n': ms_buf_puts(b, "\\n"); break;
		case '\r': ms_buf_puts(b, "\\r"); break;
		case '\t': ms_buf_puts(b, "\\t"); break;
		case '\b': ms_buf_puts(b, "\\b"); break;
		case '\f': ms_buf_puts(b, "\\f"); break;
		default:
			if (cp < 0x20)
				ms_buf_printf(b, "\\u%04x", cp);
			else
				ms_buf_append(b, p, 1);
		}
		p++;
	}
	ms_buf_puts(b, "\"");
}

static int cmp_json_key(const void *a, const void *b)
{
	return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

/*
 * JSON as Python's json.dumps(x, indent=2, sort_keys=True) writes it: the
 * format of the model.safetensors.index.json that save_pretrained writes,
 * so a merged checkpoint gets back the very bytes of its index. MS_EINVAL
 * for what it cannot write (nesting past 64), MS_ENOMEM.
 */
static int py_json(struct ms_buf *b, const cJSON *j, int depth)
{
	const cJSON *c;
	const cJSON **kids = NULL;
	size_t n = 0, k = 0;
	int rc;

	if (depth > 64)
		return MS_EINVAL;
	if (cJSON_IsNull(j)) {
		ms_buf_puts(b, "null");
	} else if (cJSON_IsBool(j)) {
		ms_buf_puts(b, cJSON_IsTrue(j) ? "true" : "false");
	} else if (cJSON_IsNumber(j)) {
		double v = j->valuedouble;
		char num[40];

		if (v == floor(v) && fabs(v) < 9007199254740992.0) {
			ms_buf_printf(b, "%.0f", v);
		} else {
			/* the shortest form that reads back, as repr() */
			for (int prec = 15; prec <= 17; prec++) {
				snprintf(num, sizeof(num), "%.*g", prec, v);
				if (strtod(num, NULL) == v)
					break;
			}
			ms_buf_puts(b, num);
		}
	} else if (cJSON_IsString(j)) {
		py_str(b, j->valuestring);
	} else if (cJSON_IsArray(j) || cJSON_IsObject(j)) {
		int obj = cJSON_IsObject(j);

		cJSON_ArrayForEach(c, j)
			n++;
		if (!n) {
			ms_buf_puts(b, obj ? "{}" : "[]");
			return MS_OK;
		}
		if (!(kids = ms_malloc(n * sizeof(*kids))))
			return MS_ENOMEM;
		cJSON_ArrayForEach(c, j)
			kids[k++] = c;
		if (obj)
			qsort(kids, n, sizeof(*kids), cmp_json_key);
		ms_buf_puts(b, obj ? "{\n" : "[\n");
		for (k = 0; k < n; k++) {
			ms_buf_printf(b, "%*s", 2 * (depth + 1), "");
			if (obj) {
				py_str(b, kids[k]->string);
				ms_buf_puts(b, ": ");
			}
			if ((rc = py_json(b, kids[k], depth + 1)) != MS_OK) {
				ms_free(kids);
				return rc;
			}
			ms_buf_puts(b, k + 1 < n ? ",\n" : "\n");
		}
		ms_buf_printf(b, "%*s%s", 2 * depth, "", obj ? "}" : "]");
		ms_free(kids);
	} else {
		return MS_EINVAL;
	}
	return MS_OK;
}

static int write_index(const struct src *s, const char *out_dir, struct ms_err *err)
{
	cJSON *root = cJSON_CreateObject(), *wm = NULL;
	char *path = NULL;
	struct ms_buf b;
	int rc = MS_OK, ok = root != NULL;

	ms_buf_init(&b);
	if (ok && s->index_meta)
		ok = ms_json_put(root, "metadata", cJSON_Duplicate(s->index_meta, 1));
	ok = ok && (wm = cJSON_AddObjectToObject(root, "weight_map"));
	for (size_t i = 0; ok && i < s->n; i++)
		ok = cJSON_AddStringToObject(wm, s->t[i].name, s->files[s->t[i].file].name) != NULL;
	if (ok && (rc = py_json(&b, root, 0)) == MS_EINVAL)
		rc = ms_err_set(err, rc, "'%s': the index metadata is nested too deeply", s->label);
	else if (rc == MS_OK && ok)
		ok = ms_buf_puts(&b, "\n") == 0 && !b.oom;
	path = ms_path_join(out_dir, s->index_name);
	if (rc == MS_OK && (!ok || !path))
		rc = ms_err_nomem(err);
	else if (rc == MS_ENOMEM)
		ms_err_nomem(err);
	else if (rc == MS_OK)
		rc = ms_file_write_atomic(path, b.data, b.len, 0, err);
	ms_buf_release(&b);
	cJSON_Delete(root);
	ms_free(path);
	return rc;
}

int ms_shard_merge(const char *dir, const char *out_dir, const struct ms_shard_opts *o,
		   struct ms_shard_result **out, struct ms_err *err)
{
	struct ms_shard_result *res = NULL;
	struct outspec *os = NULL;
	struct job *jobs = NULL;
	struct stage st;
	struct pool pool;
	struct sset ss;
	uint32_t *all = NULL;
	int32_t *lpos = NULL;
	char **spaths = NULL, *p = NULL;
	const char *fdir = out_dir;
	size_t nf = 0;
	int rc;

	*out = NULL;
	stage_init(&st);
	rc = shard_sset_open(dir, -1, 0, 0, 0, o->nthreads, NULL, &ss, err);
	if (rc != MS_OK)
		goto out;
	if (same_dir(ss.dir, out_dir)) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': merge into another directory than its input",
				out_dir);
		goto out;
	}
	/* an output that may not be replaced is refused before the hashing */
	if (!o->dry_run) {
		if ((rc = stage_open(&st, out_dir, o->force, err)) != MS_OK ||
		    (rc = shard_sset_hash_verify(&ss, o->nthreads, V_SHARDS | V_REASSEMBLE, err)) != MS_OK)
			goto out;
		fdir = st.s.dest;
	}
	nf = ss.s.nfiles;
	if ((rc = shard_result_new(&ss.s, ss.pl, nf, &res, err)) != MS_OK)
		goto out;
	all = ms_malloc((size_t)ss.s.E * sizeof(*all));
	lpos = ms_malloc((size_t)ss.s.E * sizeof(*lpos));
	os = ms_calloc(nf, sizeof(*os));
	spaths = ms_calloc(nf, sizeof(*spaths));
	jobs = ms_calloc(nf, sizeof(*jobs));
	if (!all || !lpos || !os || !spaths || !jobs) {
		rc = ms_err_nomem(err);
		goto out;
	}
	for (uint32_t e = 0; e < ss.s.E; e++) {
		all[e] = e;
		lpos[e] = (int32_t)e;
	}
	for (size_t f = 0; f < nf; f++) {
		struct ms_shard_out_file *of = &res->files[f];

		of->rank = UINT32_MAX;
		of->path = ms_path_join(fdir, ss.s.files[f].name);
		of->experts = ms_malloc((size_t)ss.s.E * sizeof(uint32_t));
		spaths[f] = o->dry_run ? NULL : stage_path(&st, ss.s.files[f].name);
		if (!of->path || !of->experts || (!o->dry_run && !spaths[f])) {
			rc = ms_err_nomem(err);
			goto out;
		}
		memcpy(of->experts, all, (size_t)ss.s.E * sizeof(uint32_t));
		of->nexperts = ss.s.E;
		os[f] = (struct outspec){ .path = spaths[f], .file = (int64_t)f, .ids = all,
					  .l = ss.s.E, .lpos = lpos, .nmeta = ss.s.files[f].nmeta,
					  .meta = ss.s.files[f].meta };
		if ((rc = shard_out_plan(&ss.s, &os[f], of, err)) != MS_OK)
			goto out;
		jobs[f].kind = JOB_FILE;
		jobs[f].file = (uint32_t)f;
	}
	if (o->dry_run)
		goto done;
	pool = (struct pool){ .jobs = jobs, .njobs = nf, .s = &ss.s, .os = os,
			      .files = res->files, .nfiles = nf, .o = o };
	if ((rc = shard_pool_run(&pool, o->nthreads, err)) != MS_OK)
		goto out;
	if (ss.s.index_name && (rc = write_index(&ss.s, ms_stage_path(&st.s), err)) != MS_OK)
		goto out;
	for (size_t c = 0; c < ss.s.nconfigs; c++) {
		if (!(p = stage_path(&st, ss.s.configs[c].name))) {
			rc = ms_err_nomem(err);
			goto out;
		}
		rc = ms_file_write_atomic(p, ss.s.configs[c].text, ss.s.configs[c].len, 0, err);
		ms_free(p);
		p = NULL;
		if (rc != MS_OK)
			goto out;
	}
	if ((rc = stage_commit(&st, res, o, err)) != MS_OK)
		goto out;
done:
	*out = res;
	res = NULL;
out:
	if (rc != MS_OK)
		stage_fix_msg(&st, err);
	stage_release(&st);
	for (size_t f = 0; spaths && f < nf; f++)
		ms_free(spaths[f]);
	ms_free(spaths);
	ms_free(os);
	ms_free(jobs);
	ms_shard_result_free(res);
	ms_free(all);
	ms_free(lpos);
	shard_sset_release(&ss);
	return rc;
}
