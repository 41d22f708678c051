#!/bin/sh
# Embed the numbered schema migrations (schema/NNNN-name.sql) into a C header
# as an array of strings, in order. Migration i brings user_version to i+1.
set -e
echo "/* generated from the schema directory by tools/scripts/embed_schema.sh */"
echo "static const char *const ms_schema_migrations[] = {"
for f in "$@"; do
	printf '\t/* %s */\n' "$(basename "$f")"
	tr -d '\r' <"$f" | awk '{ gsub(/\\/, "\\\\"); gsub(/"/, "\\\""); printf "\t\"%s\\n\"\n", $0 }'
	echo "	,"
done
echo "};"
