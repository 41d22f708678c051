/*
 * common.h: what the library's own files share beyond ms.h (errors,
 * allocation and the helpers every tool may call are there): the JSON
 * helpers over cJSON (cJSON allocating through ms_malloc, so fault
 * injection reaches it), the byte-exact JSON member splice, and fault
 * injection (MS_FAULT_ALLOC=N in the environment, honoured only when built
 * with -DMS_FAULT_INJECTION).
 */
#ifndef MS_COMMON_H
#define MS_COMMON_H

#include "ms.h"
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

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


#endif
