/*
 * common.c: errors, allocation with fault injection, parsing, buffers and
 * the JSON parser's allocation hooks.
 */
#include "common.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The message is one line even when it quotes hostile names: a tensor
 * name may hold "\n" (escaped in the JSON header), and a second line on
 * stderr would break every tool's one-line error contract. Control bytes
 * are written as \xNN, truncating at the end of the buffer. */
static void err_one_line(struct ms_err *err)
{
	char tmp[sizeof(err->msg)];
	size_t k = 0;

	for (const unsigned char *p = (const unsigned char *)err->msg; *p; p++) {
		if (*p >= 0x20 && *p != 0x7f) {
			if (k + 1 >= sizeof(tmp))
				break;
			tmp[k++] = (char)*p;
		} else {
			if (k + 4 >= sizeof(tmp))
				break;
			snprintf(tmp + k, 5, "\\x%02x", *p);
			k += 4;
		}
	}
	tmp[k] = 0;
	memcpy(err->msg, tmp, k + 1);
}

int ms_err_set(struct ms_err *err, int code, const char *fmt, ...)
{
	va_list ap;

	if (!err)
		return code;
	err->code = code;
	va_start(ap, fmt);
	vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
	va_end(ap);
	err_one_line(err);
	return code;
}

int ms_err_nomem(struct ms_err *err)
{
	return ms_err_set(err, MS_ENOMEM, "out of memory");
}

int ms_err_prefix(struct ms_err *err, const char *fmt, ...)
{
	char pre[512], old[sizeof(err->msg)];
	va_list ap;

	if (!err)
		return MS_EINVAL;
	va_start(ap, fmt);
	vsnprintf(pre, sizeof(pre), fmt, ap);
	va_end(ap);
	memcpy(old, err->msg, sizeof(old));
	{
		size_t np = strlen(pre), no = strlen(old), cap = sizeof(err->msg) - 1;

		/* truncation is acceptable: the line stays one line */
		if (np > cap)
			np = cap;
		memcpy(err->msg, pre, np);
		if (np + 2 <= cap) {
			memcpy(err->msg + np, ": ", 2);
			np += 2;
		}
		if (no > cap - np)
			no = cap - np;
		memcpy(err->msg + np, old, no);
		err->msg[np + no] = 0;
	}
	err_one_line(err);
	return err->code;
}

/* volatile sig_atomic_t: the one type a handler may store to */
static volatile sig_atomic_t interrupt_sig;

void ms_interrupt(int sig)
{
	interrupt_sig = sig > 0 && sig < 128 ? sig : SIGINT;
}

int ms_interrupted(void)
{
	return interrupt_sig;
}

int ms_interrupt_check(struct ms_err *err)
{
	int sig = interrupt_sig;

	if (!sig)
		return MS_OK;
	return ms_err_set(err, MS_EINTR, "interrupted by signal %d", sig);
}

int ms_exit_code(int rc)
{
	switch (rc) {
	case MS_OK:
		return 0;
	case MS_EINTR:
		return 128 + (interrupt_sig ? interrupt_sig : SIGINT);
	case MS_ECHECK:
		return 1;
	case MS_EINVAL:
	case MS_ENOTFOUND:
	case MS_EEXIST:
		return 2;
	default:
		return 3;
	}
}

const char *ms_rc_str(int rc)
{
	switch (rc) {
	case MS_OK: return "ok";
	case MS_ECHECK: return "check failed";
	case MS_EINVAL: return "bad input";
	case MS_EIO: return "i/o error";
	case MS_ENOMEM: return "out of memory";
	case MS_ENOTFOUND: return "not found";
	case MS_EEXIST: return "already exists";
	case MS_EDB: return "database error";
	case MS_ENODEV: return "no device";
	case MS_EINTR: return "interrupted";
	}
	return "unknown error";
}

#ifdef MS_FAULT_INJECTION
/* Each kind has its own countdown, read once from MS_FAULT_<KIND>. The Nth
 * call (1-based) fails, and with MS_FAULT_PERSIST=1 every later one too.
 * The countdown is atomic: hashing threads allocate too. */
struct fault_counter {
	const char *kind;
	long left;
	int init;
};
static struct fault_counter fault_counters[] = {
	{"alloc", 0, 0}, {"write", 0, 0}, {"fsync", 0, 0}, {"rename", 0, 0},
	{"read", 0, 0},
};

/* A sweep over N stops when the run no longer reaches the Nth call, which
 * an exit status cannot tell (a fault may be survived): with MS_FAULT_LOG
 * naming a file, every injected failure appends "<kind>\n" to it, through
 * raw system calls since the allocator may be what is failing. */
static void fault_note(const char *kind)
{
	const char *path = getenv("MS_FAULT_LOG");
	char line[32];
	int fd, n;

	if (!path || !*path)
		return;
	n = snprintf(line, sizeof(line), "%s\n", kind);
	fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	if (write(fd, line, (size_t)n) < 0) {
		/* the harness then sees no hit and reports the sweep short */
	}
	close(fd);
}

int ms_fault(const char *kind)
{
	for (size_t i = 0; i < sizeof(fault_counters) / sizeof(fault_counters[0]); i++) {
		struct fault_counter *c = &fault_counters[i];
		char name[64];
		const char *v;

		if (strcmp(c->kind, kind))
			continue;
		if (!c->init) {
			snprintf(name, sizeof(name), "MS_FAULT_%s", kind);
			for (char *p = name; *p; p++)
				if (*p >= 'a' && *p <= 'z')
					*p -= 32;
			v = getenv(name);
			c->left = v ? strtol(v, NULL, 10) : 0;
			c->init = 1;
		}
		if (__atomic_load_n(&c->left, __ATOMIC_RELAXED) <= 0)
			return 0;
		if (__atomic_sub_fetch(&c->left, 1, __ATOMIC_RELAXED) == 0) {
			const char *p = getenv("MS_FAULT_PERSIST");
			if (p && *p == '1') /* stays at the failing edge */
				__atomic_store_n(&c->left, 1, __ATOMIC_RELAXED);
			fault_note(kind);
			return 1;
		}
		return 0;
	}
	return 0;
}
#else
int ms_fault(const char *kind)
{
	(void)kind;
	return 0;
}
#endif

void *ms_malloc(size_t n)
{
	if (ms_fault("alloc"))
		return NULL;
	return malloc(n ? n : 1);
}

void *ms_calloc(size_t n, size_t size)
{
	if (ms_fault("alloc"))
		return NULL;
	if (n == 0 || size == 0)
		return calloc(1, 1);
	return calloc(n, size);
}

void *ms_realloc(void *p, size_t n)
{
	if (ms_fault("alloc"))
		return NULL;
	return realloc(p, n ? n : 1);
}

char *ms_strndup(const char *s, size_t n)
{
	char *d = ms_malloc(n + 1);

	if (!d)
		return NULL;
	memcpy(d, s, n);
	d[n] = 0;
	return d;
}

char *ms_strdup(const char *s)
{
	return ms_strndup(s, strlen(s));
}

char *ms_asprintf(const char *fmt, ...)
{
	va_list ap;
	int n;
	char *s;

	va_start(ap, fmt);
	n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0)
		return NULL;
	s = ms_malloc((size_t)n + 1);
	if (!s)
		return NULL;
	va_start(ap, fmt);
	vsnprintf(s, (size_t)n + 1, fmt, ap);
	va_end(ap);
	return s;
}

void ms_free(void *p)
{
	free(p);
}

/* cJSON gives no reason for a NULL, so its allocator counts failures per
 * thread; a caller compares the count before and after (ms_json_mark). */
static _Thread_local uint64_t json_fails;
static pthread_once_t json_once = PTHREAD_ONCE_INIT;

static void *json_malloc(size_t n)
{
	void *p = ms_malloc(n);

	if (!p)
		json_fails++;
	return p;
}

static void json_hooks(void)
{
	cJSON_Hooks h = {json_malloc, ms_free};

	cJSON_InitHooks(&h);
}

void ms_json_init(void)
{
	pthread_once(&json_once, json_hooks);
}

uint64_t ms_json_mark(void)
{
	ms_json_init();
	return json_fails;
}

int ms_json_failed(uint64_t mark)
{
	return json_fails != mark;
}

int ms_json_put(cJSON *o, const char *key, cJSON *item)
{
	if (item && (key ? cJSON_AddItemToObject(o, key, item) : cJSON_AddItemToArray(o, item)))
		return 1;
	cJSON_Delete(item);
	return 0;
}

int ms_cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int ms_str_ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);

	return n >= m && !memcmp(s + n - m, suffix, m);
}

cJSON *ms_json_parse_opts(const char *text, size_t len, const char **end, int require_nul,
			  int *oom)
{
	uint64_t mark = ms_json_mark();
	cJSON *o = cJSON_ParseWithLengthOpts(text, len, end, require_nul);

	if (oom)
		*oom = !o && ms_json_failed(mark);
	return o;
}

cJSON *ms_json_parse(const char *text, size_t len, int *oom)
{
	return ms_json_parse_opts(text, len, NULL, 0, oom);
}

/* ---- JSON text edits ------------------------------------------------------ */

static size_t js_ws(const char *s, size_t n, size_t i)
{
	while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
		i++;
	return i;
}

/* past the string that starts at s[i] ('"'); n when unterminated */
static size_t js_str(const char *s, size_t n, size_t i)
{
	for (i++; i < n; i++) {
		if (s[i] == '\\')
			i++;
		else if (s[i] == '"')
			return i + 1;
	}
	return n;
}

/* past the value that starts at s[i] */
static size_t js_value(const char *s, size_t n, size_t i)
{
	int depth = 0;

	if (i < n && s[i] == '"')
		return js_str(s, n, i);
	if (i < n && s[i] != '{' && s[i] != '[') {
		while (i < n && !strchr(",}] \t\r\n", s[i]))
			i++;
		return i;
	}
	while (i < n) {
		if (s[i] == '"') {
			i = js_str(s, n, i);
			continue;
		}
		if (s[i] == '{' || s[i] == '[')
			depth++;
		else if ((s[i] == '}' || s[i] == ']') && --depth == 0)
			return i + 1;
		i++;
	}
	return n;
}

/* The members of a top-level object: where the member key is (rb, re: the
 * bytes to remove with it), where the last value ends, the closing brace,
 * the first member's indentation. */
struct js_obj {
	size_t nmem, open, close, last_end;
	int found;
	size_t rb, re;
	size_t ind, nind;          /* indentation: s[ind, ind + nind) */
};

static int js_scan(const char *s, size_t n, const char *key, struct js_obj *o)
{
	size_t klen = strlen(key), i = js_ws(s, n, 0);

	memset(o, 0, sizeof(*o));
	if (i >= n || s[i] != '{')
		return -1;
	o->open = i++;
	for (;;) {
		size_t ks, ke, ve, after;

		i = js_ws(s, n, i);
		if (i < n && s[i] == '}' && !o->nmem) {
			o->close = i;
			break;
		}
		if (i >= n || s[i] != '"')
			return -1;
		ks = i;
		ke = js_str(s, n, ks);
		if (!o->nmem) {
			size_t b = ks;

			while (b > o->open + 1 && s[b - 1] != '\n')
				b--;
			if (s[b - 1] == '\n') {
				o->ind = b;
				o->nind = ks - b;
			}
		}
		i = js_ws(s, n, ke);
		if (i >= n || s[i] != ':')
			return -1;
		i = js_ws(s, n, i + 1);
		ve = js_value(s, n, i);
		if (ve >= n || ve == i)
			return -1;
		after = js_ws(s, n, ve);
		if (ke - ks == klen + 2 && !memcmp(s + ks + 1, key, klen)) {
			o->found = 1;
			if (after < n && s[after] == ',') {
				o->rb = ks;
				o->re = js_ws(s, n, after + 1);
			} else {
				o->rb = o->nmem ? o->last_end : ks;
				o->re = ve;
			}
		}
		o->last_end = ve;
		o->nmem++;
		i = after;
		if (i < n && s[i] == ',') {
			i++;
			continue;
		}
		if (i < n && s[i] == '}') {
			o->close = i;
			break;
		}
		return -1;
	}
	return js_ws(s, n, o->close + 1) == n ? 0 : -1;
}

int ms_json_splice_member(const char *text, size_t len, const char *key,
			  const char *value, char **out, size_t *out_len,
			  struct ms_err *err)
{
	struct js_obj o;
	char *t = NULL, *r = NULL, *unit = NULL;
	size_t tn, vn, k = 0, nunit;
	uint64_t cap;
	int rc = MS_OK;

	*out = NULL;
	*out_len = 0;
	if (js_scan(text, len, key, &o))
		return ms_err_set(err, MS_EINVAL, "not a JSON object");
	/* the text without the member */
	tn = o.found ? len - (o.re - o.rb) : len;
	if (!(t = ms_malloc(tn + 1)))
		return ms_err_nomem(err);
	if (o.found) {
		memcpy(t, text, o.rb);
		memcpy(t + o.rb, text + o.re, len - o.re);
	} else {
		memcpy(t, text, len);
	}
	t[tn] = '\0';
	if (!value) {
		*out = t;
		*out_len = tn;
		return MS_OK;
	}
	if (js_scan(t, tn, key, &o)) {
		rc = ms_err_set(err, MS_EINVAL, "not a JSON object");
		goto out;
	}
	/* the indentation unit: the first member's, else two spaces */
	nunit = o.nmem && o.nind ? o.nind : 2;
	if (!(unit = ms_malloc(nunit + 1))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	if (o.nmem && o.nind)
		memcpy(unit, t + o.ind, nunit);
	else
		memset(unit, ' ', nunit);
	/* worst case: every byte of value a tab, each an indentation unit */
	vn = strlen(value);
	if (ms_mul_u64(vn + 1, nunit + 2, &cap) ||
	    ms_add_u64(cap, tn + strlen(key) + 16, &cap) || cap > SIZE_MAX ||
	    !(r = ms_malloc((size_t)cap))) {
		rc = ms_err_nomem(err);
		goto out;
	}
	{
		size_t at = o.nmem ? o.last_end : o.open + 1;
		int in_str = 0;

		memcpy(r, t, at);
		k = at;
		if (o.nmem)
			r[k++] = ',';
		r[k++] = '\n';
		memcpy(r + k, unit, nunit);
		k += nunit;
		k += (size_t)sprintf(r + k, "\"%s\": ", key);
		for (size_t i = 0; i < vn; i++) {
			char c = value[i];

			r[k++] = c;
			if (in_str) {
				if (c == '\\' && i + 1 < vn)
					r[k++] = value[++i];
				else if (c == '"')
					in_str = 0;
			} else if (c == '"') {
				in_str = 1;
			} else if (c == ':' && i + 1 < vn && value[i + 1] == '\t') {
				r[k++] = ' ';
				i++;
			} else if (c == '\n') {
				/* one unit for the member, one per tab */
				memcpy(r + k, unit, nunit);
				k += nunit;
				while (i + 1 < vn && value[i + 1] == '\t') {
					memcpy(r + k, unit, nunit);
					k += nunit;
					i++;
				}
			}
		}
		if (!o.nmem)
			r[k++] = '\n';
		memcpy(r + k, t + at, tn - at);
		k += tn - at;
		r[k] = '\0';
	}
	*out = r;
	*out_len = k;
	r = NULL;
out:
	ms_free(r);
	ms_free(unit);
	ms_free(t);
	return rc;
}

int ms_parse_u64(const char *s, uint64_t max, uint64_t *out)
{
	uint64_t v = 0;

	if (!s || !*s)
		return -1;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return -1;
		if (ms_mul_u64(v, 10, &v) || ms_add_u64(v, (uint64_t)(*s - '0'), &v))
			return -1;
	}
	if (v > max)
		return -1;
	*out = v;
	return 0;
}

int ms_parse_double(const char *s, double *out)
{
	char *end;
	double v;

	if (!s || !*s)
		return -1;
	errno = 0;
	v = strtod(s, &end);
	if (errno || *end || !isfinite(v))
		return -1;
	*out = v;
	return 0;
}

void ms_hex(const uint8_t *in, size_t n, char *out)
{
	static const char d[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++) {
		out[2 * i] = d[in[i] >> 4];
		out[2 * i + 1] = d[in[i] & 15];
	}
	out[2 * n] = 0;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int ms_unhex(const char *in, uint8_t *out, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		int hi = hexval(in[2 * i]), lo;

		if (hi < 0)
			return -1;
		lo = hexval(in[2 * i + 1]);
		if (lo < 0)
			return -1;
		out[i] = (uint8_t)(hi << 4 | lo);
	}
	return in[2 * n] ? -1 : 0;
}

void ms_buf_init(struct ms_buf *b)
{
	b->data = NULL;
	b->len = b->cap = 0;
	b->oom = 0;
}

void ms_buf_release(struct ms_buf *b)
{
	ms_free(b->data);
	ms_buf_init(b);
}

int ms_buf_append(struct ms_buf *b, const void *p, size_t n)
{
	if (b->oom)
		return MS_ENOMEM;
	if (b->len + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap : 64;
		char *d;

		while (cap < b->len + n + 1)
			cap *= 2;
		d = ms_realloc(b->data, cap);
		if (!d) {
			b->oom = 1;
			return MS_ENOMEM;
		}
		b->data = d;
		b->cap = cap;
	}
	if (n)
		memcpy(b->data + b->len, p, n);
	b->len += n;
	b->data[b->len] = 0;
	return MS_OK;
}

int ms_buf_puts(struct ms_buf *b, const char *s)
{
	return ms_buf_append(b, s, strlen(s));
}

int ms_buf_printf(struct ms_buf *b, const char *fmt, ...)
{
	char small[256];
	va_list ap;
	int n, rc;
	char *big;

	va_start(ap, fmt);
	n = vsnprintf(small, sizeof(small), fmt, ap);
	va_end(ap);
	if (n < 0)
		return MS_EINVAL;
	if ((size_t)n < sizeof(small))
		return ms_buf_append(b, small, (size_t)n);
	big = ms_malloc((size_t)n + 1);
	if (!big) {
		b->oom = 1;
		return MS_ENOMEM;
	}
	va_start(ap, fmt);
	vsnprintf(big, (size_t)n + 1, fmt, ap);
	va_end(ap);
	rc = ms_buf_append(b, big, (size_t)n);
	ms_free(big);
	return rc;
}

char *ms_buf_detach(struct ms_buf *b, size_t *len)
{
	char *d;

	if (b->oom) {
		ms_buf_release(b);
		return NULL;
	}
	if (!b->data && ms_buf_append(b, "", 0))
		return NULL;
	d = b->data;
	if (len)
		*len = b->len;
	ms_buf_init(b);
	return d;
}

int ms_ncpus(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	return n < 1 ? 1 : (int)n;
}

const char *ms_bytes_str(uint64_t n, char *buf)
{
	static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
	double v = (double)n;
	int u = -1;

	if (n < 1024) {
		snprintf(buf, MS_BYTES_STR_LEN, "%llu B", (unsigned long long)n);
		return buf;
	}
	while (v >= 1024.0 && u < 5) {
		v /= 1024.0;
		u++;
	}
	snprintf(buf, MS_BYTES_STR_LEN, "%.2f %s", v, units[u]);
	return buf;
}

double ms_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
