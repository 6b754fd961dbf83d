# The job's bookkeeping, in bash alone: the compute node needs no Python for it (the
# stage may live in a container), and it is quick enough to finish inside SLURM's
# KillWait after a SIGTERM. It appends one JSON line per event to $PT_EVENTS
# (slurm/events.jsonl, which `pt-slurm status` reads) under the lock pt-slurm's own
# writes take ($PT_LOCK), and decides what the job does when its step has ended.
#
# Set by the job script: PT_EVENTS PT_LOCK MAX_FAILURES MAX_REQUEUES COMPLETION
# PROGRESS_FILE REQUEUE_EXIT_CODE HANG_EXIT_CODE, and SLURM's SLURM_JOB_ID SLURM_RESTART_COUNT.

pt_now() {
    printf '%(%Y-%m-%dT%H:%M:%S%z)T' -1
}

# pt_json TEXT: TEXT as a JSON string, quotes included.
pt_json() {
    local s=$1
    s=${s//\\/\\\\}
    s=${s//\"/\\\"}
    s=${s//$'\n'/\\n}
    s=${s//$'\r'/\\r}
    s=${s//$'\t'/\\t}
    s=${s//[[:cntrl:]]/}
    printf '"%s"' "$s"
}

# The lock is held on an fd of this shell; flock(1) runs with TERM and USR1 ignored,
# so that the signal which ends a job cannot kill it half way.
pt_lock() {
    exec {pt_lock_fd}>>"$PT_LOCK" || return 1
    if ! (trap '' TERM USR1; exec flock -x "$pt_lock_fd"); then
        exec {pt_lock_fd}>&-
        return 1
    fi
}

pt_unlock() {
    exec {pt_lock_fd}>&-
}

pt_append() {
    printf '%s\n' "$1" >>"$PT_EVENTS"
}

# pt_read_counts: failures, requeues and cancelled as the events since the last
# submission left them (each end event carries the counts after it).
pt_read_counts() {
    failures=0
    requeues=0
    cancelled=0
    local line
    [ -f "$PT_EVENTS" ] || return 0
    while IFS= read -r line || [ -n "$line" ]; do
        case $line in
            '{"event":"submit"'*)
                failures=0
                requeues=0
                cancelled=0
                ;;
            '{"event":"cancel"'*) cancelled=1 ;;
            '{"event":"end"'*)
                if [[ $line =~ \"failures\":([0-9]+) ]]; then failures=${BASH_REMATCH[1]}; fi
                if [[ $line =~ \"requeues\":([0-9]+) ]]; then requeues=${BASH_REMATCH[1]}; fi
                ;;
        esac
    done <"$PT_EVENTS"
}

# pt_progress: the progress file's content (its first 200 characters), or nothing.
pt_progress() {
    local text=""
    if [ -n "$PROGRESS_FILE" ] && [ -f "$PROGRESS_FILE" ]; then
        text=$(<"$PROGRESS_FILE")
    fi
    printf '%s' "${text:0:200}"
}

# pt_find_manifest LOG OFFSET: the last manifest line ({"kind": ..., "path": ...}) in LOG
# after its first OFFSET bytes, without srun's "N: " label or torchrun's "[name0]:".
pt_find_manifest() {
    [ -f "$1" ] || return 0
    tail -c "+$(($2 + 1))" "$1" |
        sed -n -e 's/^ *[0-9][0-9]*: //' -e 's/^\[[A-Za-z_]*[0-9]*\]://' \
            -e '/^{"kind": *"[a-z]*", *"path": *"/p' |
        tail -n 1
}

# pt_decide: what to do now that the step (or the setup before it) has ended. Pure.
#   in:  phase (setup|step) exit_code signals ("USR1,TERM") manifest_found (0|1)
#        intent (the 85 or 86 a rank exited with, when the launcher exited otherwise)
#        progress_at_start progress_now slurm_requeued (0|1) preempted (0|1) setup_line
#        failures requeues cancelled (from pt_read_counts)
#   out: action (done|requeue|slurm-requeue|stop) status reason failures requeues
pt_decide() {
    local finished=0 what=""
    if [ "$phase" = step ]; then
        if [ "$COMPLETION" = manifest ]; then
            finished=$manifest_found
        elif [ "$exit_code" -eq 0 ]; then
            finished=1
        fi
    fi
    if [ "$finished" = 1 ]; then
        action="done" status=completed failures=0
        reason="the stage finished"
        if [ "$exit_code" -ne 0 ]; then
            reason="the stage printed its manifest, then exited $exit_code"
        fi
        return
    fi
    if [ "$cancelled" = 1 ]; then
        action=stop status=cancelled reason="cancelled with pt-slurm cancel"
        return
    fi
    if [[ ,$signals, == *,TERM,* ]]; then
        if [ "$slurm_requeued" = 1 ]; then
            # SLURM requeues the job itself (a node failed or was set down): the same
            # job id starts again; requeueing it here as well would be a second requeue.
            requeues=$((requeues + 1))
            action=slurm-requeue status=requeued
            reason="SLURM requeued the job (a node failed or was set down); the step got SIGTERM (exit $exit_code)"
        else
            action=stop status=stopped
            reason="SIGTERM (scancel, or the wall time came without SIGUSR1); exit $exit_code"
        fi
        return
    fi
    local rank_exit=""
    if [ -n "$intent" ] && [ "$intent" != "$exit_code" ]; then
        rank_exit=" (a rank exited $intent)"
    fi
    if [ "$exit_code" -eq "$HANG_EXIT_CODE" ] || [ "$intent" = "$HANG_EXIT_CODE" ]; then
        what="the hang watchdog ended the step: exit $exit_code$rank_exit"
    elif [ "$exit_code" -eq "$REQUEUE_EXIT_CODE" ] || [ "$intent" = "$REQUEUE_EXIT_CODE" ] ||
        [[ ,$signals, == *,USR1,* ]]; then
        local asked="exit $exit_code$rank_exit"
        if [ "$phase" = setup ]; then
            asked="SIGUSR1 before the step started"
        elif [[ ,$signals, == *,USR1,* ]]; then
            asked="SIGUSR1, exit $exit_code$rank_exit"
        fi
        if [ "$preempted" = 1 ]; then
            # SLURM signalled the step of a job it preempts (PreemptMode=REQUEUE, within
            # GraceTime): this requeue is the only one; SLURM's finds the job pending.
            asked="preempted by SLURM, $asked"
        fi
        if [ -z "$PROGRESS_FILE" ]; then
            # Nothing shows what a run saved (no slurm.progress): a requeue would start the
            # stage over, so it is counted like a failure, whatever the stage's kind.
            what="$asked without a progress file to show a saved step (set slurm.progress)"
        elif [ "$progress_now" = "$progress_at_start" ]; then
            what="$asked without progress (${PROGRESS_FILE##*/} still ${progress_now:-absent})"
        elif [ "$requeues" -ge "$MAX_REQUEUES" ]; then
            action=stop status=failed
            reason="$asked asks for a requeue, but the job has been requeued $requeues times (max_requeues=$MAX_REQUEUES): giving up"
            return
        else
            requeues=$((requeues + 1))
            action=requeue status=requeued
            reason="$asked: ${PROGRESS_FILE##*/} now ${progress_now:-absent}, continuing (requeue $requeues of at most $MAX_REQUEUES)"
            return
        fi
    elif [ "$phase" = setup ]; then
        what="setup failed (exit $exit_code) at: $setup_line"
    elif [ "$exit_code" -eq 0 ]; then
        what="exit 0 without the stage's manifest (the stage did not finish)"
    else
        what="exit $exit_code"
    fi
    failures=$((failures + 1))
    if [ "$failures" -lt "$MAX_FAILURES" ]; then
        action=requeue status=retrying
        reason="$what: failure $failures of $MAX_FAILURES, retrying"
    else
        action=stop status=failed
        reason="$what: failure $failures of $MAX_FAILURES, giving up"
    fi
}

pt_record_start() {
    pt_lock || return 1
    pt_append "{\"event\":\"start\",\"time\":\"$(pt_now)\",\"job_id\":$(pt_json "$SLURM_JOB_ID"),\"restart\":${SLURM_RESTART_COUNT:-0},\"nodes\":$(pt_json "${SLURM_JOB_NODELIST:-}"),\"progress\":$(pt_json "$progress_at_start")}"
    pt_unlock
}

# pt_record_end: read the counts, decide and append the end event, all under the lock.
pt_record_end() {
    pt_lock || return 1
    pt_read_counts
    pt_decide
    local manifest=false
    if [ "$manifest_found" = 1 ]; then manifest=true; fi
    pt_append "{\"event\":\"end\",\"time\":\"$(pt_now)\",\"job_id\":$(pt_json "$SLURM_JOB_ID"),\"restart\":${SLURM_RESTART_COUNT:-0},\"phase\":\"$phase\",\"exit_code\":$exit_code,\"signals\":$(pt_json "$signals"),\"manifest\":$manifest,\"progress\":$(pt_json "$progress_now"),\"failures\":$failures,\"requeues\":$requeues,\"action\":\"$action\",\"status\":\"$status\",\"reason\":$(pt_json "$reason")}"
    pt_unlock
}

pt_record_requeue_failed() {
    pt_lock || return 1
    pt_append "{\"event\":\"requeue_failed\",\"time\":\"$(pt_now)\",\"job_id\":$(pt_json "$SLURM_JOB_ID"),\"message\":$(pt_json "$1")}"
    pt_unlock
}

# pt_read_input FILE: PT_INPUT = the "path" of the upstream stage's manifest in FILE.
# shellcheck disable=SC2317,SC2329  # used by the stages of a pipeline that take an input
pt_read_input() {
    local manifest="" path_re='"path": *"([^"\\]*)"'
    PT_INPUT=""
    if [ -f "$1" ]; then
        manifest=$(<"$1")
    fi
    if [[ $manifest =~ $path_re ]]; then
        PT_INPUT=${BASH_REMATCH[1]}
    fi
    [ -n "$PT_INPUT" ]
}
