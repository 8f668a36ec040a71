#!/usr/bin/env bash
# The GPU checks (issue 38; the GPU checklist of the developers' brief) as one prepared script, for a session
# lent a device. On the device (Python with torch, torchvision, scikit-learn, typer, rich, jinja2, matplotlib,
# safetensors; opacus and lpips carried as wheels) from the repository root:
#
#     bash scripts/gpu_checks.sh card      # the card's command, cnn and resnet18 (paper profile, 3 rounds)
#     bash scripts/gpu_checks.sh methods   # --attack all for every method on digits (2 rounds each)
#     bash scripts/gpu_checks.sh bench     # the three benchmarks, ResNet-18 (the issue's point 5 targets)
#     bash scripts/gpu_checks.sh audit REC # fedaudit audit of a recording REC on the GPU
#     bash scripts/gpu_checks.sh lease [REC --model M]  # what fits one 15-minute lease (one call under 9 minutes):
#                                          # the card's command (cnn, then resnet18 at 40 iterations), domain twins
#                                          # under client-level DP, the audit of REC, two benchmarks
#
# A recording for `audit` is made here on the CPU (Flower is not on the device) and carried:
#     python examples/flower_digits/run.py --rounds 2 --local-epochs 1 --out gpu-recording
# Each command's exit status, seconds and command line go to $OUT/summary.md (OUT: the device tool's folder,
# else ./gpu-checks), its output to $OUT/<name>.log, and every run directory's metrics.json to $OUT/runs/.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}  # keep wheels carried into /tmp/site
out=${OUT:-gpu-checks}
mkdir -p "$out/runs"
summary="$out/summary.md"
[ -f "$summary" ] || printf '| check | exit | seconds | command |\n|---|---|---|---|\n' > "$summary"
python3 -c 'import torch; print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__, "cuda",
torch.version.cuda, "cudnn", torch.backends.cudnn.version())' | tee -a "$out/device.txt"

check() {  # check NAME LIMIT_SECONDS COMMAND...
    local name=$1 limit=$2 start rc secs
    shift 2
    start=$(date +%s.%N)
    timeout "$limit" "$@" > "$out/$name.log" 2>&1
    rc=$?
    secs=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$start" "$(date +%s.%N)")
    printf '| %s | %s | %s | `%s` |\n' "$name" "$rc" "$secs" "$*" >> "$summary"
    tail -n 3 "$out/$name.log"
}

evaluate() {  # evaluate NAME LIMIT OPTIONS...: fedaudit evaluate into $out/runs/NAME
    local name=$1 limit=$2
    shift 2
    check "$name" "$limit" python3 -m fedaudit.cli evaluate --device cuda --out "$out/runs/$name" "$@"
}

case "${1:-card}" in
    card)
        evaluate card-cnn 300 --method gperxan --attack deepinversion
        evaluate card-resnet18 300 --method gperxan --attack deepinversion --profile paper --model resnet18 --rounds 3
        evaluate card-cnn-loop 300 --method gperxan --attack deepinversion --rounds 3 --inversion-victims loop
        evaluate card-cnn-bf16 300 --method gperxan --attack deepinversion --rounds 3 --precision bf16
        ;;
    methods)
        for method in fedavg fedprox fedsb fedgala gperxan fedfd fedfd_a fedlsi feddg_ga elcfs ccst; do
            evaluate "all-$method" 240 --method "$method" --dataset digits --attack all --rounds 2
        done
        ;;
    bench)
        check engine-overhead 400 python3 benchmarks/engine_overhead.py --device cuda --model resnet18 --deterministic --repeats 4
        check inversion-speed 300 python3 benchmarks/inversion_speed.py --device cuda --model resnet18 --batch 256
        check reference-models 300 python3 benchmarks/reference_models.py --device cuda --models 64
        ;;
    lease)  # ordered by what a crash would reopen first; the limits sum to 540 s. REC (optional): a recording
        # made here, audited on the GPU (the plain-PyTorch example's: give its --model after it)
        evaluate card-cnn 100 --method gperxan --attack deepinversion
        evaluate card-resnet18 130 --method gperxan --attack deepinversion --profile paper --model resnet18 \
            --rounds 3 --inversion-iters 40
        evaluate domain-twins-client-dp 100 --method fedavg --dataset digits --attack mia-domain --rounds 2 \
            --client-dp-epsilon 8
        if [ -n "${2:-}" ]; then
            check audit 90 python3 -m fedaudit.cli audit "$2" --device cuda --out "$out/runs/audit" "${@:3}"
        fi
        check inversion-speed 60 python3 benchmarks/inversion_speed.py --device cuda --model resnet18 --batch 256
        check reference-models 60 python3 benchmarks/reference_models.py --device cuda --models 64
        ;;
    lease-overhead)  # the engine-overhead benchmark alone (90 s on an H100), for a lease with time left
        check engine-overhead 150 python3 benchmarks/engine_overhead.py --device cuda --model resnet18 --deterministic --repeats 4
        ;;
    audit)
        check audit 300 python3 -m fedaudit.cli audit "${2:?give the recording directory}" --device cuda \
            --out "$out/runs/audit"
        ;;
    *)
        echo "usage: bash scripts/gpu_checks.sh card|methods|bench|lease [REC ...]|lease-overhead|audit REC" >&2
        exit 2
        ;;
esac
find "$out/runs" -name metrics.json -newer "$out/device.txt" -printf '%p\n' | head -50
cat "$summary"
