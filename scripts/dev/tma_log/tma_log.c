/* tma_log.so: logs every cuTensorMapEncodeTiled call of a process (issue 28's lead F1: FA4's
 * tensor maps beside flashgen's, field by field). LD_PRELOAD it; lines go to $TMA_LOG (default
 * stderr), one per encode:
 *   encode dtype=D rank=R addr=0x.. dims=[..] strides=[..] box=[..] estrides=[..]
 *          interleave=I swizzle=S l2promo=L oobfill=F rc=RC
 * Callers find the driver entry point in three ways, all caught here: the dynamic linker
 * (direct calls), dlsym on a libcuda handle (ctypes, CuTe DSL's runtime library: LD_PRELOAD
 * does not interpose a handle's lookups, so dlsym itself is wrapped), and cuGetProcAddress
 * (the CUDA runtime, cuda-python).
 * Build: cc -O2 -shared -fPIC -o tma_log.so tma_log.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef CUresult (*encode_fn)(void *, int, unsigned, void *, const uint64_t *, const uint64_t *,
                              const unsigned *, const unsigned *, int, int, int, int);
typedef CUresult (*procaddr_fn)(const char *, void **, int, uint64_t, int *);

static encode_fn real_encode;
static procaddr_fn real_procaddr_v2;
static void *(*real_dlsym)(void *, const char *);

static FILE *out(void) {
  static FILE *f;
  if (!f) {
    const char *path = getenv("TMA_LOG");
    f = path ? fopen(path, "a") : NULL;
    if (!f) f = stderr;
  }
  return f;
}

static void list64(FILE *f, const char *name, const uint64_t *v, unsigned n) {
  fprintf(f, " %s=[", name);
  for (unsigned i = 0; v && i < n; ++i) fprintf(f, i ? ",%llu" : "%llu", (unsigned long long)v[i]);
  fprintf(f, "]");
}

static void list32(FILE *f, const char *name, const unsigned *v, unsigned n) {
  fprintf(f, " %s=[", name);
  for (unsigned i = 0; v && i < n; ++i) fprintf(f, i ? ",%u" : "%u", v[i]);
  fprintf(f, "]");
}

static CUresult logged_encode(void *map, int dtype, unsigned rank, void *addr, const uint64_t *dims,
                              const uint64_t *strides, const unsigned *box, const unsigned *estr,
                              int interleave, int swizzle, int l2, int oob) {
  CUresult rc = real_encode ? real_encode(map, dtype, rank, addr, dims, strides, box, estr,
                                          interleave, swizzle, l2, oob)
                            : 1;
  FILE *f = out();
  fprintf(f, "encode dtype=%d rank=%u addr=%p", dtype, rank, addr);
  list64(f, "dims", dims, rank);
  list64(f, "strides", strides, rank > 0 ? rank - 1 : 0);  /* bytes, dims 1.. */
  list32(f, "box", box, rank);
  list32(f, "estrides", estr, rank);
  fprintf(f, " interleave=%d swizzle=%d l2promo=%d oobfill=%d rc=%d\n", interleave, swizzle, l2,
          oob, rc);
  fflush(f);
  return rc;
}

static CUresult logged_procaddr_v2(const char *sym, void **pfn, int ver, uint64_t flags, int *st) {
  CUresult rc = real_procaddr_v2(sym, pfn, ver, flags, st);
  if (rc == 0 && sym && pfn && *pfn && strcmp(sym, "cuTensorMapEncodeTiled") == 0) {
    real_encode = (encode_fn)*pfn;
    *pfn = (void *)logged_encode;
  }
  return rc;
}

static void *find_real_dlsym(void) {
  void *p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  return p ? p : dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
}

void *dlsym(void *handle, const char *name) {
  if (!real_dlsym) real_dlsym = (void *(*)(void *, const char *))find_real_dlsym();
  void *p = real_dlsym(handle, name);
  if (!p) return p;
  if (strcmp(name, "cuTensorMapEncodeTiled") == 0) {
    real_encode = (encode_fn)p;
    return (void *)logged_encode;
  }
  if (strcmp(name, "cuGetProcAddress_v2") == 0) {
    real_procaddr_v2 = (procaddr_fn)p;
    return (void *)logged_procaddr_v2;
  }
  return p;
}

/* direct (dynamically linked) calls */
CUresult cuTensorMapEncodeTiled(void *map, int dtype, unsigned rank, void *addr,
                                const uint64_t *dims, const uint64_t *strides, const unsigned *box,
                                const unsigned *estr, int interleave, int swizzle, int l2, int oob) {
  if (!real_encode) {
    void *lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!lib) lib = dlopen("libcuda.so.1", RTLD_LAZY);
    if (!real_dlsym) real_dlsym = (void *(*)(void *, const char *))find_real_dlsym();
    real_encode = lib ? (encode_fn)real_dlsym(lib, "cuTensorMapEncodeTiled") : NULL;
  }
  return logged_encode(map, dtype, rank, addr, dims, strides, box, estr, interleave, swizzle, l2,
                       oob);
}
