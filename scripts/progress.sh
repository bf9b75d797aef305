# Sourced by the engine installers: with_progress LABEL LOG CMD... runs CMD with its output
# appended to LOG and, every minute it is still running, says so on stderr with the minutes so
# far and LOG's last line, so a first-time build of ten minutes reads as progress, not a hang.
# Returns CMD's exit status; an interrupted installer takes CMD down with it.
with_progress() {
  local label=$1 log=$2 pid start waited
  shift 2
  "$@" >>"$log" 2>&1 &
  pid=$!
  trap 'kill "$pid" 2>/dev/null' INT TERM
  start=$SECONDS
  while kill -0 "$pid" 2>/dev/null; do
    waited=0
    while [ "$waited" -lt 60 ] && kill -0 "$pid" 2>/dev/null; do
      sleep 1
      waited=$((waited + 1))
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "$label: still running after $(( (SECONDS - start) / 60 )) min: $(tail -n 1 "$log" 2>/dev/null | cut -c1-120)" >&2
    fi
  done
  trap - INT TERM
  wait "$pid"
}
