/*
 * inv_format.c: the inventory's recorded JSON fields (a command line, a
 * configuration file) turned into the text a front end shows, so that
 * msinv and the Python package show records the same way without parsing
 * JSON themselves.
 */
#include <string.h>

#include <cjson/cJSON.h>

#include "inventory.h"

int ms_inv_argv_text(const char *argv_json, char **text, struct ms_err *err)
{
	struct ms_buf b;
	cJSON *a, *it;
	int first = 1, nomem;

	*text = NULL;
	if (!argv_json)
		return MS_OK;
	ms_buf_init(&b);
	a = ms_json_parse(argv_json, strlen(argv_json), &nomem);
	if (nomem)
		return ms_err_nomem(err);
	/* not an array of strings: nothing to show (the words that are) */
	cJSON_ArrayForEach(it, a) {
		if (cJSON_IsString(it)) {
			ms_buf_printf(&b, "%s%s", first ? "" : " ", it->valuestring);
			first = 0;
		}
	}
	cJSON_Delete(a);
	*text = ms_buf_detach(&b, NULL);
	return *text ? MS_OK : ms_err_nomem(err);
}

int ms_inv_config_quant(const struct ms_inv_config *c, char **json, struct ms_err *err)
{
	cJSON *root, *q;
	int nomem;

	*json = NULL;
	if (strcmp(c->name, "config.json"))
		return MS_OK;
	root = ms_json_parse(c->text, c->len, &nomem);
	q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
	if (q && !(*json = cJSON_PrintUnformatted(q)))
		nomem = 1;
	cJSON_Delete(root);
	return nomem ? ms_err_nomem(err) : MS_OK;
}
