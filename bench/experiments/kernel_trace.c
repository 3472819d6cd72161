// A kernel timeline of any CUDA program in a real run (the test machine has no Nsight Systems, and ncu runs kernels
// one at a time): a CUPTI injection library that records every kernel's start and end on the GPU and writes them
// at exit, for bench/experiments/kernel_gaps.py.
//
// Build (CUPTI headers and library from the nvidia-cuda-cupti wheel, cuda.h from the CUDA toolkit):
//   gcc -O2 -shared -fPIC -I<cu13>/include kernel_trace.c -o libkernel_trace.so -L<cu13>/lib -l:libcupti.so.13
// Run: CUDA_INJECTION64_PATH=$PWD/libkernel_trace.so KERNEL_TRACE_OUT=trace.csv <program ...>
// (a "%p" in KERNEL_TRACE_OUT becomes PROGRAM-PID: one file per process of a script).
// The CSV has one row per kernel: start and end (ns, GPU clock), stream, name. With KERNEL_TRACE_API_US=N it also
// has a row for every CUDA driver call that took N microseconds or more on the host (stream "api", the call's
// name; CUPTI gives both kinds of record one clock), so kernel_gaps.py can say which host calls an idle gap holds.
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BUF_BYTES (8u << 20)

static FILE *out;
static unsigned long long api_min_ns;

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = (uint8_t *)aligned_alloc(8, BUF_BYTES);
    *size = BUF_BYTES;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity *record = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)record;
            fprintf(out, "%llu,%llu,%u,\"%s\"\n", (unsigned long long)k->start, (unsigned long long)k->end,
                    k->streamId, k->name ? k->name : "?");
        } else if (record->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
            const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)record;
            if (a->end - a->start >= api_min_ns) {
                const char *name = NULL;
                if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, a->cbid, &name) != CUPTI_SUCCESS || !name) {
                    name = "?";
                }
                fprintf(out, "%llu,%llu,api,\"%s\"\n", (unsigned long long)a->start, (unsigned long long)a->end,
                        name);
            }
        }
    }
    free(buffer);
}

static void finish(void) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    if (out) {
        fclose(out);
        out = NULL;
    }
}

int InitializeInjection(void) {
    const char *path = getenv("KERNEL_TRACE_OUT");
    char named[4096];
    const char *pid_at = path ? strstr(path, "%p") : NULL;
    if (pid_at) {
        // One file per process: "%p" becomes the program's name and process id.
        char comm[64] = "prog";
        FILE *f = fopen("/proc/self/comm", "r");
        if (f) {
            if (fgets(comm, sizeof comm, f)) {
                comm[strcspn(comm, "\n")] = 0;
            }
            fclose(f);
        }
        snprintf(named, sizeof named, "%.*s%s-%d%s", (int)(pid_at - path), path, comm, (int)getpid(), pid_at + 2);
        path = named;
    }
    out = fopen(path ? path : "kernel_trace.csv", "w");
    if (!out) {
        return 0;
    }
    fprintf(out, "start_ns,end_ns,stream,name\n");
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_trace: CUPTI activity setup failed\n");
        return 0;
    }
    const char *api_us = getenv("KERNEL_TRACE_API_US");
    if (api_us && *api_us) {
        api_min_ns = strtoull(api_us, NULL, 10) * 1000ull;
        if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER) != CUPTI_SUCCESS) {
            fprintf(stderr, "kernel_trace: CUPTI driver-call records unavailable\n");
        }
    }
    atexit(finish);
    return 1;
}
