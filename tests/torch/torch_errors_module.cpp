// carve_torch_errors: a Python module whose malloc calls libcarve_torch_oom the way PyTorch's
// CUDAPluggableAllocator does, inside PyTorch's own C++-to-Python error translation
// (HANDLE_TH_ERRORS, from torch/csrc/Exceptions.h: what wraps every PyTorch call that allocates).
// So test_torch_oom.py sees exactly what a PyTorch user sees when carve refuses, on a machine
// whose PyTorch has no CUDA.
#include <Python.h>
#include <carve_torch.h>
#include <torch/csrc/Exceptions.h>

#include <cstdint>

namespace {

cudaStream_t stream_of(unsigned long long handle) {
  return reinterpret_cast<cudaStream_t>(static_cast<std::uintptr_t>(handle));
}

// malloc(size, device, stream) -> address (0 for a size of 0 or below)
PyObject* malloc_block(PyObject*, PyObject* args) {
  HANDLE_TH_ERRORS
  long long size = 0;
  int device = 0;
  unsigned long long stream = 0;
  if (!PyArg_ParseTuple(args, "LiK", &size, &device, &stream)) {
    return nullptr;
  }
  void* p = carve_torch_malloc_or_raise(static_cast<ssize_t>(size), device, stream_of(stream));
  return PyLong_FromVoidPtr(p);
  END_HANDLE_TH_ERRORS
}

// free(address, size, device, stream)
PyObject* free_block(PyObject*, PyObject* args) {
  HANDLE_TH_ERRORS
  unsigned long long address = 0;
  long long size = 0;
  int device = 0;
  unsigned long long stream = 0;
  if (!PyArg_ParseTuple(args, "KLiK", &address, &size, &device, &stream)) {
    return nullptr;
  }
  carve_torch_free(reinterpret_cast<void*>(static_cast<std::uintptr_t>(address)), static_cast<ssize_t>(size), device,
                   stream_of(stream));
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// set_fault(message or None): carve_torch_host_device_fault
PyObject* set_fault(PyObject*, PyObject* args) {
  const char* message = nullptr;
  if (!PyArg_ParseTuple(args, "z", &message)) {
    return nullptr;
  }
  carve_torch_host_device_fault(message);
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"malloc", malloc_block, METH_VARARGS, "carve_torch_malloc_or_raise(size, device, stream)"},
    {"set_fault", set_fault, METH_VARARGS, "carve_torch_host_device_fault(message or None)"},
    {"free", free_block, METH_VARARGS, "carve_torch_free(address, size, device, stream)"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "carve_torch_errors", nullptr, -1, methods, nullptr, nullptr, nullptr, nullptr};

} // namespace

PyMODINIT_FUNC PyInit_carve_torch_errors() { return PyModule_Create(&module); }
