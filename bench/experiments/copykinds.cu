// Per-thread copy kinds for the staged ring: pageable THP master (DRAM) -> small pinned ring (cache), alone and
// feeding the copy engine (nvcc -O2 -std=c++17 copykinds.cu; no arguments).
#include <cuda_runtime.h>
#include <immintrin.h>
#include <sys/mman.h>
#include <sched.h>
#include <thread>
#include <vector>
#include <atomic>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <cstdlib>
static double now(){return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();}
static int KIND=0; static size_t DIST=0;
__attribute__((target("avx2"))) static void avx2_pf(char* d,const char* s,size_t n){ size_t i=0;
  for(; i+64<=n; i+=64){ if(DIST) _mm_prefetch(s+i+DIST,_MM_HINT_T0); __m256i a=_mm256_loadu_si256((const __m256i*)(s+i)); __m256i b=_mm256_loadu_si256((const __m256i*)(s+i+32));
    _mm256_storeu_si256((__m256i*)(d+i),a); _mm256_storeu_si256((__m256i*)(d+i+32),b);} memcpy(d+i,s+i,n-i); }
__attribute__((target("avx512f"))) static void avx512_pf(char* d,const char* s,size_t n){ size_t i=0;
  for(; i+128<=n; i+=128){ if(DIST){ _mm_prefetch(s+i+DIST,_MM_HINT_T0); _mm_prefetch(s+i+DIST+64,_MM_HINT_T0);} __m512i a=_mm512_loadu_si512(s+i); __m512i b=_mm512_loadu_si512(s+i+64);
    _mm512_storeu_si512(d+i,a); _mm512_storeu_si512(d+i+64,b);} memcpy(d+i,s+i,n-i); }
static void movsb(char* d,const char* s,size_t n){ asm volatile("rep movsb":"+D"(d),"+S"(s),"+c"(n)::"memory"); }
static void cp(char* d,const char* s,size_t n){ switch(KIND){case 0: memcpy(d,s,n); break; case 1: avx2_pf(d,s,n); break; case 2: movsb(d,s,n); break; default: avx512_pf(d,s,n);} }
struct Pool {
  int T; std::vector<std::thread> th; std::atomic<long> gen{0}; std::atomic<int> done{0}; std::atomic<bool> quit{false};
  char* d=nullptr; const char* s=nullptr; size_t n=0;
  Pool(int T):T(T){ for(int t=0;t<T;t++) th.emplace_back([this,t]{ long seen=0; for(;;){ long g; while((g=gen.load(std::memory_order_acquire))==seen){ if(quit) return; _mm_pause(); } seen=g; if(quit) return;
      size_t per=((n+this->T-1)/this->T+63)&~63ul; size_t a=t*per; if(a<n){ size_t len=std::min(per,n-a); cp(d+a,s+a,len);} done.fetch_add(1,std::memory_order_acq_rel);} }); }
  void copy(char* dd,const char* ss,size_t nn){ d=dd;s=ss;n=nn; done=0; gen.fetch_add(1,std::memory_order_acq_rel); while(done.load(std::memory_order_acquire)<this->T) _mm_pause(); }
  ~Pool(){ quit=true; gen.fetch_add(1); for(auto&x:th) x.join(); }
};
int main(){
  const size_t total=6ul<<30; const size_t C=8ul<<20; const int R=4;
  char* src=(char*)mmap(nullptr,total,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  madvise(src,total,MADV_HUGEPAGE); memset(src,1,total);
  void* dev; cudaMalloc(&dev,total/4);
  cudaStream_t st; cudaStreamCreateWithFlags(&st,cudaStreamNonBlocking);
  char* ring; cudaHostAlloc((void**)&ring,C*R,0); memset(ring,0,C*R);
  std::vector<cudaEvent_t> ev(R); for(auto&e:ev) cudaEventCreateWithFlags(&e,cudaEventDisableTiming);
  { char* pin; cudaHostAlloc((void**)&pin,1ul<<30,0); memset(pin,0,1ul<<30); double t0=now(); for(int r=0;r<8;r++) cudaMemcpyAsync(dev,pin,1ul<<30,cudaMemcpyHostToDevice,st); cudaStreamSynchronize(st); printf("dma alone %.1f GB/s\n",8.0*(1ul<<30)/(now()-t0)/1e9); cudaFreeHost(pin); }
  struct K{int kind; size_t dist; const char* name;};
  std::vector<K> kinds={{0,0,"memcpy"},{2,0,"rep movsb"},{1,0,"avx2"},{1,512,"avx2 pf512"},{1,1024,"avx2 pf1k"},{1,2048,"avx2 pf2k"},{1,4096,"avx2 pf4k"},{3,0,"avx512"},{3,1024,"avx512 pf1k"},{3,2048,"avx512 pf2k"}};
  for(auto k: kinds){ KIND=k.kind; DIST=k.dist;
    for(int T: {1,8}){ Pool pool(T); size_t bytes=T==1? (1ul<<30) : total; size_t j=0; double t0=now();
      for(size_t off=0; off+C<=bytes; off+=C, j++) pool.copy(ring+(j%R)*C,src+off,C);
      printf("%-12s copy alone T=%d %.1f GB/s\n",k.name,T,bytes/(now()-t0)/1e9); }
    for(int T: {7,8,10}){ Pool pool(T); std::vector<bool> used(R,false); double t0=now(); size_t j=0;
      for(size_t off=0; off+C<=total; off+=C, j++){ int r=j%R; if(used[r]) cudaEventSynchronize(ev[r]);
        pool.copy(ring+r*C,src+off,C); cudaMemcpyAsync((char*)dev+(off%(total/4)),ring+r*C,C,cudaMemcpyHostToDevice,st); cudaEventRecord(ev[r],st); used[r]=true; }
      cudaStreamSynchronize(st); printf("%-12s pipeline T=%d %.1f GB/s\n",k.name,T,total/(now()-t0)/1e9); }
    fflush(stdout);
  }
  return 0; }
