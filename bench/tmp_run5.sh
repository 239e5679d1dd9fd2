export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$LD_LIBRARY_PATH
DEADLINE=400 bash bench/device_session.sh tests bench peers pytest > $OUT/session.log 2>&1
cp $OUT/summary.txt $OUT/summary_main.txt 2>/dev/null
TESTS=test_decode_gpu DEADLINE=170 bash bench/device_session.sh memcheck racecheck > $OUT/session_san.log 2>&1
tail -45 $OUT/session.log
tail -4 $OUT/session_san.log
