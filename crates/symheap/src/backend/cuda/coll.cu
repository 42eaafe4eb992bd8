// placeholder: the collective kernels land here
