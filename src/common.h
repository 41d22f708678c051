/*
 * common.h: error codes, the error buffer, allocation and small helpers
 * shared by every part of libms.
 *
 * Contract: library functions never print and never exit. They return
 * MS_OK or a negative-free MS_E* code and, when given a struct ms_err, leave
 * one lowercase line there naming the file, tensor and rule broken (like
 * sqlite3_errmsg). Tools map codes to the pinned exit statuses with
 * ms_exit_code().
 *
 * All allocation goes through ms_malloc() and friends so that the fault
 * injection build can fail the Nth allocation (MS_FAULT_ALLOC=N in the
 * environment, honoured only when built with -DMS_FAULT_INJECTION).
 */
#ifndef MS_COMMON_H
#define MS_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define MS_VERSION "0.1.0"

enum ms_rc {
	MS_OK = 0,
	MS_ECHECK = 1,    /* a check ran and found a difference (exit 1) */
	MS_EINVAL = 2,    /* bad input: malformed file, bad argument (exit 2) */
	MS_EIO = 3,       /* I/O or environment failure (exit 3) */
	MS_ENOMEM = 4,    /* allocation failed (exit 3) */
	MS_ENOTFOUND = 5, /* named object does not exist (exit 2) */
	MS_EEXIST = 6,    /* output exists and --force was not given (exit 2) */
	MS_EDB = 7,       /* database error (exit 3) */
	MS_ENODEV = 8,    /* no GPU when one was demanded (exit 3) */
	MS_EINTR = 9,     /* interrupted by a signal (exit 128 + the signal) */
};

/* One error line, filled by the function that failed first. */
struct ms_err {
	int code;
	char msg[1024];
};

/* Set err (may be NULL) to code and a printf-style message; returns code. */
int ms_err_set(struct ms_err *err, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Set err to MS_ENOMEM, "out of memory" (the one wording of an allocation
 * failure); returns MS_ENOMEM. */
int ms_err_nomem(struct ms_err *err);
/* Prefix an existing message: "<prefix>: <old message>". Returns err->code. */
int ms_err_prefix(struct ms_err *err, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Map a return code to the pinned tool exit status (0, 1, 2 or 3; for
 * MS_EINTR 128 + the signal, as a shell reports a process it killed). */
int ms_exit_code(int rc);
/* Short name of a code, e.g. "bad input". */
const char *ms_rc_str(int rc);

/* Allocation. ms_malloc(0) returns a valid unique pointer. ms_free(NULL) is
 * a no-op. All return NULL on failure (or an injected failure). */
void *ms_malloc(size_t n);
void *ms_calloc(size_t n, size_t size);
void *ms_realloc(void *p, size_t n);
char *ms_strdup(const char *s);
char *ms_strndup(const char *s, size_t n);
char *ms_asprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void ms_free(void *p);

/* JSON parsing (cJSON). cJSON allocates through hooks installed once per
 * process by ms_json_init (the parse helpers call it): ms_malloc, so the
 * fault injection reaches every node, and ms_free, so anything cJSON
 * returns (a tree, cJSON_Print* text) may be freed with cJSON_Delete,
 * cJSON_free or ms_free alike. cJSON answers NULL both for malformed text
 * and for a failed allocation; the helpers tell them apart: *oom (may be
 * NULL) is 1 when the parse failed for want of memory (report MS_ENOMEM,
 * "out of memory"), 0 otherwise (the text is not JSON). */
struct cJSON;
void ms_json_init(void);
/* cJSON_ParseWithLength: len bytes of text, not necessarily NUL-terminated;
 * bytes after the first value are ignored. */
struct cJSON *ms_json_parse(const char *text, size_t len, int *oom);
/* cJSON_ParseWithLengthOpts: *end (may be NULL) gets where parsing stopped
 * (the error's position on failure); require_nul: only whitespace and a NUL
 * inside len may follow the value (pass len + 1 to count a terminator). */
struct cJSON *ms_json_parse_opts(const char *text, size_t len, const char **end,
				 int require_nul, int *oom);
/* A tree built with cJSON_Create* and cJSON_Add* (each NULL on a failed
 * allocation, seldom checked member by member) may come out short: take
 * ms_json_mark() before building it and ask ms_json_failed(mark) before
 * using it; non-zero when one of cJSON's allocations on this thread failed
 * in between. */
uint64_t ms_json_mark(void);
int ms_json_failed(uint64_t mark);
/* Add item to object o under key (to array o when key is NULL), taking
 * item in every case: deleted when it cannot be added (o or item missing,
 * the key's copy failed), so a failed allocation leaks nothing and shows
 * in ms_json_failed. Returns 1 when added, else 0. */
int ms_json_put(struct cJSON *o, const char *key, struct cJSON *item);

/* qsort comparator of an array of C strings (char *), by strcmp. */
int ms_cmp_str(const void *a, const void *b);
/* Does s end with suffix? */
int ms_str_ends_with(const char *s, const char *suffix);

/*
 * Edit one member of a JSON object given as text, leaving every other byte
 * as it is (cJSON reprints numbers: 1.0 would become 1, which strict
 * loaders refuse where a float is declared). text[0, len) must be a JSON
 * object. The member key (matched on its raw bytes between the quotes) is
 * removed, with one comma beside it, when present; when value is not NULL
 * (JSON text, such as cJSON_Print output) the member is then added as the
 * object's last, indented one level more than the object's own members
 * (the indentation of its first member, two spaces for an empty object;
 * tabs at the start of value's lines become that unit). *out (ms_malloc,
 * NUL-terminated) and *out_len get the new text. MS_EINVAL when text is
 * not a JSON object, MS_ENOMEM.
 */
int ms_json_splice_member(const char *text, size_t len, const char *key,
			  const char *value, char **out, size_t *out_len,
			  struct ms_err *err);

/* Fault injection (only active in -DMS_FAULT_INJECTION builds). Returns
 * non-zero when the call site named by kind ("alloc", "write", "fsync",
 * "rename") must fail now. Counters come from MS_FAULT_<KIND>=N. */
int ms_fault(const char *kind);

/* Checked arithmetic: return 0 on success, -1 on overflow. */
static inline int ms_add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
	return __builtin_add_overflow(a, b, out) ? -1 : 0;
}
static inline int ms_mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
	return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}

/* Range-checked integer parsing for command lines and text formats (no atoi).
 * Accepts decimal digits only (no sign, no spaces). */
int ms_parse_u64(const char *s, uint64_t max, uint64_t *out);
/* Parse a double; rejects trailing garbage, NaN and Inf. */
int ms_parse_double(const char *s, double *out);

/* Progress of long work (hashing, packing, extracting): fn(arg, done,
 * total) in bytes, called from the thread that started the work, a few
 * times a second at most and once at the end. The library reports; the
 * tools decide whether and how to show it (on a terminal only). */
struct ms_progress {
	void (*fn)(void *arg, uint64_t done, uint64_t total);
	void *arg;
};

/* A byte count for people, the one size format of every tool's text output:
 * exact below 1 KiB ("512 B"), else binary units with two decimals
 * ("1.50 GiB"; KiB, MiB, GiB, TiB, PiB, EiB). --json output gives exact
 * byte counts instead. Writes at most MS_BYTES_STR_LEN bytes to buf and
 * returns buf. */
#define MS_BYTES_STR_LEN 24
const char *ms_bytes_str(uint64_t n, char *buf);

/* Lowercase hex of n bytes into out (2n+1 bytes). */
void ms_hex(const uint8_t *in, size_t n, char *out);
/* Parse 2n lowercase/uppercase hex digits into n bytes; -1 if malformed. */
int ms_unhex(const char *in, uint8_t *out, size_t n);

/* A growable byte buffer (git's strbuf). Embedded: ms_buf_init/release. */
struct ms_buf {
	char *data;
	size_t len;
	size_t cap;
	int oom; /* set when an append failed; the buffer stays valid */
};
void ms_buf_init(struct ms_buf *b);
void ms_buf_release(struct ms_buf *b);
int ms_buf_append(struct ms_buf *b, const void *p, size_t n);
int ms_buf_puts(struct ms_buf *b, const char *s);
int ms_buf_printf(struct ms_buf *b, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Take ownership of the NUL-terminated contents; b is reset. */
char *ms_buf_detach(struct ms_buf *b, size_t *len);

/*
 * Interruption. A tool that writes installs a handler for SIGINT, SIGTERM
 * and SIGHUP that calls ms_interrupt(sig), which only stores the number
 * (async-signal-safe). The library's long loops (every write, every block
 * hashed, every tensor converted or packed) poll ms_interrupted() and fail
 * with MS_EINTR, so the ordinary error path runs: staging removed, the
 * inventory batch rolled back, nothing published. The library installs no
 * handler itself: signal disposition belongs to the program.
 */
void ms_interrupt(int sig);
/* The signal that interrupted the process, or 0. */
int ms_interrupted(void);
/* MS_EINTR with "interrupted by signal N" in err when interrupted, else
 * MS_OK. */
int ms_interrupt_check(struct ms_err *err);

/* Number of online CPUs (at least 1). */
int ms_ncpus(void);
/* Wall clock in seconds (monotonic). */
double ms_now(void);

#endif
