export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
B=build-device-bin/ab/main/bench_decode
for k in 16 32 64 16 32 64; do $B --case DEC-MTP --topk $k --iters 30 --warmup 3 2>&1 | cut -c1-175; done
