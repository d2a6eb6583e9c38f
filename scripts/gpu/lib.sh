# Shared by the GPU scripts (sourced, from the repo root or anywhere in it): the results folder, the logs folder,
# the summary file and `step`, which runs one command under the script's time budget.
# Before sourcing: OUT (required) and optionally BUDGET_S (seconds all steps share, default 350).
# After: the working directory is the repo root, PYTHONPATH holds it, LOGS="$OUT/logs", SUMMARY="$OUT/summary.txt"
# (emptied), START the budget's start.
OUT=${OUT:?set OUT to the folder for the results}
BUDGET_S=${BUDGET_S:-350}
LOGS="$OUT/logs"
SUMMARY="$OUT/summary.txt"
mkdir -p "$LOGS"
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PYTHONPATH="$PWD:$PWD/protos${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
START=$SECONDS
: >"$SUMMARY"

step() {  # step NAME LIMIT_S COMMAND...: at most LIMIT_S (or what the budget has left), output in $LOGS/NAME.log
    local name=$1 limit=$2
    shift 2
    local left=$((BUDGET_S - (SECONDS - START)))
    if ((left < 20)); then
        echo "$name: skipped, budget spent" | tee -a "$SUMMARY"
        return
    fi
    ((limit > left)) && limit=$left
    local began=$SECONDS
    echo "== $name (at most ${limit}s): $*" >>"$LOGS/commands.txt"
    timeout --kill-after=10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
    echo "$name: rc=$? in $((SECONDS - began))s" | tee -a "$SUMMARY"
}
