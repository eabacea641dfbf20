nvcc -O3 -arch=sm_90a -o $OUT/softmax_rate softmax_rate.cu && $OUT/softmax_rate
