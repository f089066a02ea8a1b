#!/usr/bin/env bash
# Every H200 fidelity report the README quotes, from the committed captures: refit
# conf/profiles/h200_qwen3-4b.yaml on the fit captures, then each held-out run against the
# simulator (and each fit capture fitted on itself against its own held-out run).
#
#   scripts/fidelity_h200.sh          (CPU only, about a minute)
set -euo pipefail
cd "$(dirname "$0")/.."
G=results/gpu P=conf/profiles/h200_qwen3-4b.yaml
A=$G/dec04_capture B=$G/dec04_grid_capture                    # the fit captures (16-session held-out runs too)
LA=$G/dec04_long_a LB=$G/dec04_long_b LC=$G/dec04_long_c       # 128-session held-out runs, 28 GiB CPU tier
OA=$G/dec04_long_overflow_a OB=$G/dec04_long_overflow_b       # the same on a 12 GiB tier
fid() { python -m experiments.fidelity profile=$P "$@"; }

python -m experiments.calibrate steps=$A/served_fit.jsonl,$A/steps_grid_4b.jsonl,$B/served_fit.jsonl,$B/steps_grid_4b.jsonl \
    validate_report=$B/validate.json model=qwen3-4b out=$P > results/fidelity_h200_calibrate.txt
fid served=$B/validate.json steps=$B/served_heldout.jsonl repeat=$A/validate.json sensitivity=0.01 \
    report=results/fidelity_h200.json figure=docs/img/fidelity_h200.png > results/fidelity_h200.txt
fid served=$A/validate.json steps=$A/served_heldout.jsonl repeat=$B/validate.json sensitivity=0.01 \
    report=results/fidelity_h200_second.json > results/fidelity_h200_second.txt
fid served=$LA/validate.json steps=$LA/served_heldout.jsonl.gz repeat=$LB/validate.json sensitivity=0.01 \
    report=results/fidelity_h200_long.json figure=docs/img/fidelity_h200_long.png > results/fidelity_h200_long.txt
fid served=$LB/validate.json steps=$LB/served_heldout.jsonl.gz repeat=$LA/validate.json sensitivity=0.01 \
    report=results/fidelity_h200_long_second.json > results/fidelity_h200_long_second.txt
fid served=$LC/validate.json steps=$LC/served_heldout.jsonl.gz repeat=$LA/validate.json sensitivity=0.01 \
    report=results/fidelity_h200_long_third.json > results/fidelity_h200_long_third.txt
fid served=$OA/validate.json repeat=$OB/validate.json report=results/fidelity_h200_long_overflow.json \
    > results/fidelity_h200_long_overflow.txt
K=$G/dec04_clean             # a fresh lease's fit run, grid and held-out run, for the clean same-lease test
for C in $A $B $K; do   # same-lease calibration: each capture's own fit run and grid, then its held-out run
    x=; [ -e $C/served_fit.jsonl.gz ] && x=.gz
    python -m experiments.calibrate steps=$C/served_fit.jsonl$x,$C/steps_grid_4b.jsonl$x validate_report=$C/validate.json \
        model=qwen3-4b name=self out=$C/profile_self.yaml > $C/calibrate_self.txt
    python -m experiments.fidelity served=$C/validate.json profile=$C/profile_self.yaml steps=$C/served_heldout.jsonl$x \
        sensitivity=0.01 report=$C/fidelity_self.json > $C/fidelity_self.txt
done
fid served=$K/validate.json steps=$K/served_heldout.jsonl.gz repeat=$B/validate.json \
    report=results/fidelity_h200_clean.json > results/fidelity_h200_clean.txt
F=$G/dec04_heldout_fresh                                         # captured after the model changes
fid served=$F/validate.json steps=$F/served_heldout.jsonl.gz repeat=$B/validate.json sensitivity=0.01 \
    report=results/fidelity_h200_fresh.json > results/fidelity_h200_fresh.txt
{ fid served=$B/validate.json arrivals=real; fid served=$A/validate.json arrivals=real; } \
    > results/fidelity_h200_pinned_arrivals.txt
written=(results/fidelity_h200{,_second,_long,_long_second,_long_third,_long_overflow,_fresh,_clean,_pinned_arrivals}.txt
         $A/fidelity_self.txt $B/fidelity_self.txt $K/fidelity_self.txt)
for f in "${written[@]}"; do
    awk -v f="$f" '/met:/ {n++; if (/NO/) m++} END {printf "%-48s %2d of %2d verdict lines miss a target\n", f, m, n}' "$f"
done
