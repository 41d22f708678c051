# lib.sh: helpers the benchmark scripts share (sourced, not run).

# best CMD...: the least wall time in seconds of MS_BENCH_RUNS (default 3)
# runs of CMD, whose output is discarded. Machines are noisy: the fastest
# run is the one least disturbed.
best() {
	_b=""
	_i=0
	while [ $_i -lt "${MS_BENCH_RUNS:-3}" ]; do
		_s=$(date +%s.%N); "$@" >/dev/null; _e=$(date +%s.%N)
		_t=$(echo "$_e - $_s" | bc -l)
		if [ -z "$_b" ] || [ "$(echo "$_t < $_b" | bc -l)" = 1 ]; then _b=$_t; fi
		_i=$((_i + 1))
	done
	echo "$_b"
}
