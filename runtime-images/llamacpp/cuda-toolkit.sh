#!/bin/sh
# Assemble a CUDA toolkit from NVIDIA's PyPI wheels (nvidia-cuda-nvcc, -crt, nvidia-nvvm,
# -cuda-runtime, -cublas, -cuda-cccl: all of CUDA 13 unpack under nvidia/cu13/) into the layout
# of NVIDIA's own installer, which nvcc's nvcc.profile and CMake's FindCUDAToolkit expect:
#
#   PREFIX/bin/nvcc ...              PREFIX/nvvm/bin/cicc, PREFIX/nvvm/libdevice/
#   PREFIX/targets/<arch>-linux/{include,lib}   (nvcc.profile's $(_TARGET_DIR_))
#   PREFIX/include, PREFIX/lib64 -> targets/<arch>-linux/{include,lib}
#
# plus the unversioned .so links a link step needs (libcublas.so -> libcublas.so.13, ...).
#
#   cuda-toolkit.sh WHEEL_DIR PREFIX
set -eu
wheels=$1
prefix=$2
case "$(uname -m)" in
  x86_64) target=x86_64-linux ;;
  aarch64) target=sbsa-linux ;;
  *) echo "cuda-toolkit.sh: no CUDA target for $(uname -m)" >&2; exit 1 ;;
esac
unpacked=$(mktemp -d)
for wheel in "$wheels"/*.whl; do
  python3 -m zipfile -e "$wheel" "$unpacked"
done
cu=$unpacked/nvidia/cu13
if [ ! -x "$cu/bin/nvcc" ] && [ ! -f "$cu/bin/nvcc" ]; then
  echo "cuda-toolkit.sh: no nvidia/cu13/bin/nvcc in $wheels (the nvidia-cuda-nvcc wheel)" >&2
  exit 1
fi
mkdir -p "$prefix/targets/$target"
# zipfile keeps no modes: everything under bin/ is an executable (nvcc.profile is read, the
# crt/*.stub files are inputs of nvlink; +x on them is harmless).
cp -a "$cu/bin" "$cu/nvvm" "$prefix/"
chmod -R a+rX "$prefix/bin" "$prefix/nvvm"
chmod a+x "$prefix"/bin/* "$prefix"/nvvm/bin/*
cp -a "$cu/include" "$cu/lib" "$prefix/targets/$target/"
ln -s "targets/$target/include" "$prefix/include"
ln -s "targets/$target/lib" "$prefix/lib64"
for library in "$prefix/targets/$target/lib"/lib*.so.*; do
  ln -s "$(basename "$library")" "${library%%.so.*}.so"
done
rm -rf "$unpacked"
"$prefix/bin/nvcc" --version
