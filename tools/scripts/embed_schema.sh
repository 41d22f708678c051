#!/bin/sh
# Embed the numbered schema migrations (schema/NNNN-name.sql) into a C header
# as an array of strings, in order. Migration i brings user_version to i+1.
set -e
echo "/* generated from schema/*.sql by tools/scripts/embed_schema.sh */"
echo "static const char *const ms_schema_migrations[] = {"
for f in "$@"; do
	printf '\t/* %s */\n\t"' "$(basename "$f")"
	sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/$/\\n"/' -e '$!s/$/\n\t"/' "$f" | tr -d '\r'
	echo ","
done
echo "};"
