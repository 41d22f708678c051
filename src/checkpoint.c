/*
 * checkpoint.c: open a file, a directory (sharded through
 * model.safetensors.index.json or not) or several paths as one set of
 * tensors, and compute the state identity. Rules in checkpoint.h.
 */
#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "fsutil.h"
#include "hash.h"

/* Configuration files that change how tensors are read. */
static const char *const config_names[] = {
	"config.json", "hf_quant_config.json", "adapter_config.json",
	"quantization_config.json", "ep_manifest.json",
};

static int add_file(struct ms_ckpt *c, const char *path, const char *name,
		    struct ms_err *err)
{
	struct ms_st_file *f;
	struct ms_st_file **nf;
	char **nn;
	int rc;

	if ((rc = ms_st_open(path, &f, err)) != MS_OK)
		return rc;
	nf = ms_realloc(c->files, (c->nfiles + 1) * sizeof(*nf));
	if (nf)
		c->files = nf;
	nn = ms_realloc(c->file_names, (c->nfiles + 1) * sizeof(*nn));
	if (nn)
		c->file_names = nn;
	if (!nf || !nn || !(nn[c->nfiles] = ms_strdup(name))) {
		ms_st_close(f);
		return ms_err_nomem(err);
	}
	c->files[c->nfiles++] = f;
	return MS_OK;
}

static int add_config(struct ms_ckpt *c, const char *dir, const char *name, int side,
		      struct ms_err *err)
{
	struct ms_ckpt_config *cfg, *nc;
	char *path = ms_path_join(dir, name);
	struct stat st;
	int rc;

	if (!path)
		return ms_err_nomem(err);
	if (stat(path, &st) || !S_ISREG(st.st_mode)) {
		ms_free(path);
		return MS_OK;
	}
	for (size_t i = 0; i < c->nconfigs; i++) {
		if (!strcmp(c->configs[i].name, name)) {
			uint8_t d[MS_SHA256_LEN];

			/* the same tokenizer beside two paths of one state */
			if (side && c->configs[i].side &&
			    ms_sha256_file(path, d, err) == MS_OK &&
			    !memcmp(d, c->configs[i].digest, MS_SHA256_LEN)) {
				ms_free(path);
				return MS_OK;
			}
			rc = ms_err_set(err, MS_EINVAL,
					"'%s': a second '%s' in the same state (from '%s')", path,
					name, c->configs[i].path);
			ms_free(path);
			return rc;
		}
	}
	nc = ms_realloc(c->configs, (c->nconfigs + 1) * sizeof(*nc));
	if (!nc) {
		ms_free(path);
		return ms_err_nomem(err);
	}
	c->configs = nc;
	cfg = &c->configs[c->nconfigs];
	memset(cfg, 0, sizeof(*cfg));
	cfg->path = path;
	cfg->side = side;
	if ((rc = ms_file_read(path, side ? MS_CKPT_MAX_SIDE : MS_CKPT_MAX_CONFIG, &cfg->text,
			       &cfg->len, err)) != MS_OK) {
		ms_free(path);
		return rc;
	}
	cfg->name = ms_strdup(name);
	if (!cfg->name || ms_sha256(cfg->text, cfg->len, cfg->digest) != MS_OK) {
		ms_free(cfg->name);
		ms_free(cfg->text);
		ms_free(path);
		return ms_err_nomem(err);
	}
	if (!strcmp(name, "adapter_config.json"))
		c->is_adapter = 1;
	c->nconfigs++;
	return MS_OK;
}

/* Is name a side file of a directory (checkpoint.h)? Configuration files
 * are not: they are added by name first. */
static int is_side_name(const char *name)
{
	static const char *const weights[] = {MS_CKPT_WEIGHT_SUFFIXES};

	if (name[0] == '.' || ms_str_ends_with(name, ".safetensors") || !strcmp(name, "MANIFEST.json"))
		return 0;
	for (size_t i = 0; i < sizeof(config_names) / sizeof(config_names[0]); i++)
		if (!strcmp(name, config_names[i]))
			return 0;
	for (size_t i = 0; i < sizeof(weights) / sizeof(weights[0]); i++)
		if (ms_str_ends_with(name, weights[i]))
			return 0;
	return 1;
}

/* Every side file of dir, in name order (add_config skips what is not a
 * regular file). */
static int add_side_files(struct ms_ckpt *c, const char *dir, struct ms_err *err)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	char **names = NULL;
	size_t n = 0, cap = 0;
	int rc = MS_OK;

	if (!d)
		return ms_err_set(err, MS_EIO, "'%s': cannot read directory: %s", dir, strerror(errno));
	while ((de = readdir(d))) {
		if (!is_side_name(de->d_name))
			continue;
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 16;
			char **nn = ms_realloc(names, nc * sizeof(*nn));

			if (!nn) {
				rc = ms_err_nomem(err);
				goto out;
			}
			names = nn;
			cap = nc;
		}
		if (!(names[n] = ms_strdup(de->d_name))) {
			rc = ms_err_nomem(err);
			goto out;
		}
		n++;
	}
	if (n)
		qsort(names, n, sizeof(*names), ms_cmp_str);
	for (size_t i = 0; i < n && rc == MS_OK; i++)
		rc = add_config(c, dir, names[i], 1, err);
out:
	closedir(d);
	for (size_t i = 0; i < n; i++)
		ms_free(names[i]);
	ms_free(names);
	return rc;
}

/* Directory with model.safetensors.index.json. */
static int open_index(struct ms_ckpt *c, const char *dir, const char *index,
		      struct ms_err *err)
{
	char *text = NULL;
	size_t len;
	cJSON *root = NULL, *map, *it;
	char **files = NULL;
	size_t nfiles = 0;
	/* files opened before this index (ms_ckpt_open_many) are not its own */
	size_t first = c->nfiles;
	int rc, nomem;

	if ((rc = ms_file_read(index, MS_CKPT_MAX_INDEX, &text, &len, err)) != MS_OK)
		return rc;
	/* several sharded paths (ms_ckpt_open_many): the first index is named */
	if (!c->index_path && !(c->index_path = ms_strdup(index))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	/* len + 1: cJSON wants the terminating NUL inside the length to accept
	 * trailing whitespace when it must check that nothing else follows */
	root = ms_json_parse_opts(text, len + 1, NULL, 1, &nomem);
	if (nomem) {
		rc = ms_err_nomem(err);
		goto out;
	}
	if (!root || !cJSON_IsObject(root)) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': index is not a JSON object", index);
		goto out;
	}
	map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
	if (!cJSON_IsObject(map)) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': index has no \"weight_map\" object", index);
		goto out;
	}
	/* the distinct file names, each a plain name inside dir */
	files = ms_malloc((size_t)(cJSON_GetArraySize(map) + 1) * sizeof(*files));
	if (!files) {
		rc = ms_err_nomem(err);
		goto out;
	}
	cJSON_ArrayForEach(it, map) {
		if (!cJSON_IsString(it)) {
			rc = ms_err_set(err, MS_EINVAL,
					"'%s': weight_map entry '%s' is not a file name", index,
					it->string);
			goto out;
		}
		if (!ms_name_is_plain(it->valuestring) ||
		    !ms_str_ends_with(it->valuestring, ".safetensors")) {
			rc = ms_err_set(err, MS_EINVAL,
					"'%s': weight_map entry '%s' names '%s', which is not a plain .safetensors file name in the directory",
					index, it->string, it->valuestring);
			goto out;
		}
		files[nfiles++] = it->valuestring;
	}
	/* cJSON keeps duplicate keys; a name listed twice could hide a tensor
	 * the map does not list when only the counts are compared */
	{
		char **keys = ms_malloc((nfiles ? nfiles : 1) * sizeof(*keys));
		size_t k = 0;

		if (!keys) {
			rc = ms_err_nomem(err);
			goto out;
		}
		cJSON_ArrayForEach(it, map)
			keys[k++] = it->string;
		qsort(keys, k, sizeof(*keys), ms_cmp_str);
		for (size_t i = 1; i < k; i++) {
			if (!strcmp(keys[i], keys[i - 1])) {
				rc = ms_err_set(err, MS_EINVAL,
						"'%s': weight_map lists tensor '%s' twice", index,
						keys[i]);
				ms_free(keys);
				goto out;
			}
		}
		ms_free(keys);
	}
	qsort(files, nfiles, sizeof(*files), ms_cmp_str);
	for (size_t i = 0; i < nfiles; i++) {
		char *path;

		if (i && !strcmp(files[i], files[i - 1]))
			continue;
		path = ms_path_join(dir, files[i]);
		if (!path) {
			rc = ms_err_nomem(err);
			goto out;
		}
		rc = add_file(c, path, files[i], err);
		if (rc == MS_ENOTFOUND)
			rc = ms_err_set(err, MS_EINVAL, "'%s': index lists '%s', which does not exist",
					index, files[i]);
		ms_free(path);
		if (rc != MS_OK)
			goto out;
	}
	/* every mapped tensor exactly once, in the file the map says; and no
	 * tensor the map does not list */
	{
		size_t listed = 0;

		cJSON_ArrayForEach(it, map) {
			const struct ms_tensor *t = NULL;

			listed++;
			for (size_t i = first; i < c->nfiles; i++) {
				if (!strcmp(c->file_names[i], it->valuestring)) {
					t = ms_st_find(c->files[i], it->string);
					break;
				}
			}
			if (!t) {
				rc = ms_err_set(err, MS_EINVAL,
						"'%s': tensor '%s' is mapped to '%s' but not found there",
						index, it->string, it->valuestring);
				goto out;
			}
		}
		{
			size_t total = 0;

			for (size_t i = first; i < c->nfiles; i++)
				total += c->files[i]->ntensors;
			if (total != listed) {
				/* find the culprit for the message */
				for (size_t i = first; i < c->nfiles; i++) {
					for (size_t t = 0; t < c->files[i]->ntensors; t++) {
						const char *name = c->files[i]->tensors[t].name;
						cJSON *m = cJSON_GetObjectItemCaseSensitive(map, name);

						if (!m || strcmp(m->valuestring, c->file_names[i])) {
							rc = ms_err_set(err, MS_EINVAL,
									"'%s': tensor '%s' in '%s' is not listed there by the index",
									index, name, c->file_names[i]);
							goto out;
						}
					}
				}
				rc = ms_err_set(err, MS_EINVAL,
						"'%s': weight_map lists a tensor name twice", index);
				goto out;
			}
		}
	}
	rc = MS_OK;
out:
	ms_free(files);
	cJSON_Delete(root);
	ms_free(text);
	return rc;
}

static int open_dir(struct ms_ckpt *c, const char *dir, struct ms_err *err)
{
	char *index = ms_path_join(dir, "model.safetensors.index.json");
	struct stat st;
	DIR *d = NULL;
	struct dirent *de;
	char **names = NULL;
	size_t n = 0, cap = 0;
	int rc = MS_OK;

	if (!index)
		return ms_err_nomem(err);
	if (stat(index, &st) == 0) {
		rc = open_index(c, dir, index, err);
		goto configs;
	}
	d = opendir(dir);
	if (!d) {
		rc = ms_err_set(err, MS_EIO, "'%s': cannot read directory: %s", dir, strerror(errno));
		goto out;
	}
	while ((de = readdir(d))) {
		if (!ms_str_ends_with(de->d_name, ".safetensors") || de->d_name[0] == '.')
			continue;
		if (n == cap) {
			size_t nc = cap ? cap * 2 : 16;
			char **nn = ms_realloc(names, nc * sizeof(*nn));

			if (!nn) {
				rc = ms_err_nomem(err);
				goto out;
			}
			names = nn;
			cap = nc;
		}
		if (!(names[n] = ms_strdup(de->d_name))) {
			rc = ms_err_nomem(err);
			goto out;
		}
		n++;
	}
	if (n == 0) {
		rc = ms_err_set(err, MS_EINVAL, "'%s': no .safetensors files in directory", dir);
		goto out;
	}
	qsort(names, n, sizeof(*names), ms_cmp_str);
	for (size_t i = 0; i < n; i++) {
		char *path = ms_path_join(dir, names[i]);

		if (!path) {
			rc = ms_err_nomem(err);
			goto out;
		}
		rc = add_file(c, path, names[i], err);
		ms_free(path);
		if (rc != MS_OK)
			goto out;
	}
configs:
	if (rc != MS_OK)
		goto out;
	for (size_t i = 0; i < sizeof(config_names) / sizeof(config_names[0]); i++)
		if ((rc = add_config(c, dir, config_names[i], 0, err)) != MS_OK)
			goto out;
	/* the index is carried as a side file too: an exported or verified
	 * sharded checkpoint loads only with it. Several sharded directories
	 * (ms_ckpt_open_many) each have their own, checked against their own
	 * shards by open_index: the first is the one carried. */
	if (c->index_path && stat(index, &st) == 0 && !ms_ckpt_config(c, ms_path_base(index)) &&
	    (rc = add_config(c, dir, ms_path_base(index), 1, err)) != MS_OK)
		goto out;
	rc = add_side_files(c, dir, err);
out:
	if (d)
		closedir(d);
	for (size_t i = 0; i < n; i++)
		ms_free(names[i]);
	ms_free(names);
	ms_free(index);
	return rc;
}

static int open_one(struct ms_ckpt *c, const char *path, struct ms_err *err)
{
	struct stat st;

	if (stat(path, &st))
		return ms_err_set(err, errno == ENOENT ? MS_ENOTFOUND : MS_EIO,
				  "'%s': %s", path, strerror(errno));
	if (S_ISDIR(st.st_mode))
		return open_dir(c, path, err);
	if (!S_ISREG(st.st_mode))
		return ms_err_set(err, MS_EINVAL, "'%s': not a file or directory", path);
	if (ms_str_ends_with(path, ".json") && strstr(ms_path_base(path), "index")) {
		char *dir = ms_strdup(path);
		int rc;

		if (!dir)
			return ms_err_nomem(err);
		char *slash = strrchr(dir, '/');

		if (slash)
			*slash = 0;
		rc = open_index(c, !slash ? "." : *dir ? dir : "/", path, err);
		ms_free(dir);
		return rc;
	}
	return add_file(c, path, ms_path_base(path), err);
}

static int cmp_tensor_name(const void *a, const void *b)
{
	return strcmp((*(struct ms_tensor *const *)a)->name,
		      (*(struct ms_tensor *const *)b)->name);
}

static int collect(struct ms_ckpt *c, struct ms_err *err)
{
	size_t n = 0, k = 0;

	for (size_t i = 0; i < c->nfiles; i++)
		n += c->files[i]->ntensors;
	c->tensors = ms_malloc((n ? n : 1) * sizeof(*c->tensors));
	if (!c->tensors)
		return ms_err_nomem(err);
	for (size_t i = 0; i < c->nfiles; i++)
		for (size_t t = 0; t < c->files[i]->ntensors; t++)
			c->tensors[k++] = &c->files[i]->tensors[t];
	c->ntensors = n;
	qsort(c->tensors, n, sizeof(*c->tensors), cmp_tensor_name);
	for (size_t i = 1; i < n; i++)
		if (!strcmp(c->tensors[i]->name, c->tensors[i - 1]->name))
			return ms_err_set(err, MS_EINVAL, "tensor '%s' appears in both '%s' and '%s'",
					  c->tensors[i]->name, c->tensors[i - 1]->file->path,
					  c->tensors[i]->file->path);
	return MS_OK;
}

int ms_ckpt_open_many(const char *const *paths, size_t n, struct ms_ckpt **out,
		      struct ms_err *err)
{
	struct ms_ckpt *c = ms_calloc(1, sizeof(*c));
	int rc = MS_OK;

	*out = NULL;
	if (!c)
		return ms_err_nomem(err);
	for (size_t i = 0; i < n && rc == MS_OK; i++)
		rc = open_one(c, paths[i], err);
	if (rc == MS_OK && c->nfiles == 0)
		rc = ms_err_set(err, MS_EINVAL, "no safetensors files given");
	if (rc == MS_OK) {
		/* the same file given twice (directly and through its directory) */
		for (size_t i = 0; i < c->nfiles && rc == MS_OK; i++)
			for (size_t j = i + 1; j < c->nfiles; j++)
				if (c->files[i]->dev == c->files[j]->dev &&
				    c->files[i]->ino == c->files[j]->ino) {
					rc = ms_err_set(err, MS_EINVAL, "'%s' and '%s' are the same file",
							c->files[i]->path, c->files[j]->path);
					break;
				}
	}
	if (rc == MS_OK)
		rc = collect(c, err);
	if (rc != MS_OK) {
		ms_ckpt_close(c);
		return rc;
	}
	*out = c;
	return MS_OK;
}

int ms_ckpt_open(const char *path, struct ms_ckpt **out, struct ms_err *err)
{
	return ms_ckpt_open_many(&path, 1, out, err);
}

void ms_ckpt_close(struct ms_ckpt *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->nfiles; i++) {
		ms_st_close(c->files[i]);
		ms_free(c->file_names[i]);
	}
	ms_free(c->files);
	ms_free(c->file_names);
	ms_free(c->tensors);
	for (size_t i = 0; i < c->nconfigs; i++) {
		ms_free(c->configs[i].name);
		ms_free(c->configs[i].path);
		ms_free(c->configs[i].text);
	}
	ms_free(c->configs);
	ms_free(c->index_path);
	ms_free(c);
}

const struct ms_tensor *ms_ckpt_find(const struct ms_ckpt *c, const char *name)
{
	size_t lo = 0, hi = c->ntensors;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int r = strcmp(c->tensors[mid]->name, name);

		if (r == 0)
			return c->tensors[mid];
		if (r < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

const struct ms_ckpt_config *ms_ckpt_config(const struct ms_ckpt *c, const char *name)
{
	for (size_t i = 0; i < c->nconfigs; i++)
		if (!strcmp(c->configs[i].name, name))
			return &c->configs[i];
	return NULL;
}

int ms_ckpt_hash(struct ms_ckpt *c, int nthreads, int file_digests, struct ms_err *err)
{
	int rc = ms_st_hash_files(c->files, c->nfiles, nthreads, file_digests, err);

	if (rc != MS_OK || !file_digests)
		return rc;
	for (size_t i = 0; i < c->nfiles; i++) {
		struct ms_st_file *f = c->files[i];
		char hex[65];

		if (!f->blob_digest)
			continue;
		ms_hex(f->file_digest, 32, hex);
		if (strcmp(hex, f->blob_digest))
			return ms_err_set(err, MS_ECHECK,
					  "'%s': file digest %s does not match its blob name %s",
					  f->path, hex, f->blob_digest);
	}
	return MS_OK;
}

void ms_shape_str(const struct ms_tensor *t, char *buf, size_t n)
{
	size_t k = 0;

	k += (size_t)snprintf(buf + k, n - k, "[");
	for (uint32_t d = 0; d < t->ndim && k < n; d++)
		k += (size_t)snprintf(buf + k, n - k, d ? ",%llu" : "%llu",
				      (unsigned long long)t->shape[d]);
	if (k < n)
		snprintf(buf + k, n - k, "]");
}

int ms_state_manifest(struct ms_tensor *const *tensors, size_t n, char **text,
		      size_t *len, struct ms_err *err)
{
	struct ms_tensor **sorted = NULL;
	struct ms_buf b;
	int rc = MS_OK;

	*text = NULL;
	ms_buf_init(&b);
	sorted = ms_malloc((n ? n : 1) * sizeof(*sorted));
	if (!sorted)
		return ms_err_nomem(err);
	memcpy(sorted, tensors, n * sizeof(*sorted));
	qsort(sorted, n, sizeof(*sorted), cmp_tensor_name);
	ms_buf_puts(&b, "msinv-state-v1\n");
	for (size_t i = 0; i < n; i++) {
		const struct ms_tensor *t = sorted[i];
		char shape[24 * MS_ST_MAX_RANK + 4], hex[65];

		if (!t->has_digest) {
			rc = ms_err_set(err, MS_EINVAL, "tensor '%s' has not been hashed", t->name);
			goto out;
		}
		if (i && !strcmp(t->name, sorted[i - 1]->name)) {
			rc = ms_err_set(err, MS_EINVAL, "tensor '%s' appears twice", t->name);
			goto out;
		}
		ms_shape_str(t, shape, sizeof(shape));
		ms_hex(t->digest, 32, hex);
		ms_buf_printf(&b, "%s\t%s\t%s\t%s\n", t->name, ms_dtype_name(t->dtype), shape, hex);
	}
	if (b.oom) {
		rc = ms_err_nomem(err);
		goto out;
	}
	*text = ms_buf_detach(&b, len);
out:
	ms_buf_release(&b);
	ms_free(sorted);
	return rc;
}

int ms_state_digest(struct ms_tensor *const *tensors, size_t n,
		    char out[MS_STATE_DIGEST_LEN], struct ms_err *err)
{
	char *text;
	size_t len;
	uint8_t d[32];
	int rc;

	if ((rc = ms_state_manifest(tensors, n, &text, &len, err)) != MS_OK)
		return rc;
	rc = ms_sha256(text, len, d);
	ms_free(text);
	if (rc != MS_OK)
		return ms_sha256_err(err, rc);
	memcpy(out, "sha256:", 7);
	ms_hex(d, 32, out + 7);
	return MS_OK;
}
