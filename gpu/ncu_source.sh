# Sourced by the lead's GPU scripts: Nsight Compute on one launch of a kernel with per-instruction
# warp-stall sampling (SourceCounters). Needs $X (the call's output folder), $RP (where the reports
# stay) and st (the scripts' progress line). Writes ncu_NAME.{app.log,raw.csv,stalls.txt,source.csv,
# source.txt} under $X and prints the head of the two summaries (gpu/ncu_summary.py stalls / source).
SECT="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section ComputeWorkloadAnalysis --section SourceCounters"
ncu_src() {  # NAME KREGEX SKIP CAP CMD...
  local n=$1 k=$2 skip=$3 cap=$4; shift 4
  timeout $cap ncu --clock-control none $SECT --import-source no -k "regex:$k" --launch-skip $skip --launch-count 1 -o $RP/$n -f "$@" > $X/ncu_$n.app.log 2>&1
  st "ncu $n rc=$?"
  [ -f $RP/$n.ncu-rep ] || return
  ncu -i $RP/$n.ncu-rep --page raw --csv > $X/ncu_$n.raw.csv 2>&1
  python3 gpu/ncu_summary.py stalls $X/ncu_$n.raw.csv > $X/ncu_$n.stalls.txt 2>&1
  # --print-source needs ncu 2023.2 or newer; without it the page has no SASS text column.
  ncu -i $RP/$n.ncu-rep --page source --csv --print-source sass > $X/ncu_$n.source.csv 2> $X/ncu_$n.source.err \
    || ncu -i $RP/$n.ncu-rep --page source --csv > $X/ncu_$n.source.csv 2>> $X/ncu_$n.source.err
  python3 gpu/ncu_summary.py source $X/ncu_$n.source.csv > $X/ncu_$n.source.txt 2>&1
  head -12 $X/ncu_$n.stalls.txt; sed -n 1,25p $X/ncu_$n.source.txt | cut -c1-150
}
