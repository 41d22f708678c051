#!/bin/sh
# The version script of libms.so, from the public header: exactly the
# functions ms.h declares are exported, everything else (the internal
# headers' functions, the kernels' C++ symbols, the statically linked CUDA
# runtime) stays inside the library. So a program linked against libms.so
# can call what ms.h declares and nothing else, and the library cannot
# clash with the symbols of a host process (a Python interpreter that also
# loaded PyTorch). usage: libms_map.sh CC src/ms.h > libms.map
cc=${1:?usage: libms_map.sh CC ms.h}
hdr=${2:?usage: libms_map.sh CC ms.h}
names=$("$cc" -E -P -x c "$hdr" | grep -oE '\bms_[a-z0-9_]+[[:space:]]*\(' |
	sed 's/[[:space:](]*$//' | sort -u) || exit 3
[ -n "$names" ] || { echo "libms_map.sh: no function in $hdr" >&2; exit 3; }
echo "/* generated from $(basename "$hdr") by libms_map.sh: the public functions */"
echo "LIBMS_0 {"
echo "	global:"
for n in $names; do printf '\t\t%s;\n' "$n"; done
echo "	local:"
echo "		*;"
echo "};"
