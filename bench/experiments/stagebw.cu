// Staged host->device throughput: pageable master -> pinned staging -> device, as the staged streaming mode does.
// Whole-block staging (2 buffers, NT stores, 12 threads) against chunked staging through a small pinned ring that
// may stay in the CPU's last-level cache, with a persistent spinning thread pool.
#include <cuda_runtime.h>
#include <immintrin.h>
#include <sys/mman.h>
#include <thread>
#include <vector>
#include <atomic>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <cstdlib>
static double now(){return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();}
static void nt_copy(char* d, const char* s, size_t n){
  size_t i=0; for(; i+64<=n; i+=64){ __m256i a=_mm256_loadu_si256((const __m256i*)(s+i)); __m256i b=_mm256_loadu_si256((const __m256i*)(s+i+32));
    _mm256_stream_si256((__m256i*)(d+i),a); _mm256_stream_si256((__m256i*)(d+i+32),b);} memcpy(d+i,s+i,n-i); _mm_sfence(); }
struct Pool {
  int T; std::vector<std::thread> th; std::atomic<long> gen{0}; std::atomic<int> done{0}; std::atomic<bool> quit{false};
  char* d=nullptr; const char* s=nullptr; size_t n=0; bool nt=false;
  Pool(int T):T(T){ for(int t=0;t<T;t++) th.emplace_back([this,t]{ long seen=0; for(;;){ long g; while((g=gen.load(std::memory_order_acquire))==seen){ if(quit) return; _mm_pause(); } seen=g; if(quit) return;
      size_t per=((n+this->T-1)/this->T+63)&~63ul; size_t a=t*per; if(a<n){ size_t len=std::min(per,n-a); if(nt) nt_copy(d+a,s+a,len); else memcpy(d+a,s+a,len);} done.fetch_add(1,std::memory_order_acq_rel);} }); }
  void copy(char* dd,const char* ss,size_t nn,bool ntt){ d=dd;s=ss;n=nn;nt=ntt; done=0; gen.fetch_add(1,std::memory_order_acq_rel); while(done.load(std::memory_order_acquire)<this->T) _mm_pause(); }
  ~Pool(){ quit=true; gen.fetch_add(1); for(auto&x:th) x.join(); }
};
int main(int argc, char** argv){
  const size_t B=374ul<<20; const int NB=12; size_t total=B*NB;
  char* src=(char*)mmap(nullptr,total,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  madvise(src,total,MADV_HUGEPAGE); memset(src,1,total);
  void* dev; cudaMalloc(&dev,B*2);
  cudaStream_t st; cudaStreamCreateWithFlags(&st,cudaStreamNonBlocking);
  char* pin; cudaHostAlloc((void**)&pin,B*2,0); memset(pin,0,B*2);
  // DMA alone
  { double t0=now(); for(int r=0;r<10;r++) cudaMemcpyAsync((char*)dev+(r%2)*B,pin+(r%2)*B,B,cudaMemcpyHostToDevice,st); cudaStreamSynchronize(st); printf("dma alone %.1f GB/s\n",10.0*B/(now()-t0)/1e9); }
  if(argc==4){ // one chunked setting: stagebw THREADS CHUNK_MIB CHUNKS
    int T=atoi(argv[1]); size_t C=(size_t)atoi(argv[2])<<20; int R=atoi(argv[3]); Pool pool(T);
    char* ring; cudaHostAlloc((void**)&ring,C*R,0); memset(ring,0,C*R);
    std::vector<cudaEvent_t> ev(R); for(auto&e:ev) cudaEventCreateWithFlags(&e,cudaEventDisableTiming); std::vector<bool> used(R,false);
    for(int rep=0;rep<3;rep++){ double t0=now(); size_t j=0;
      for(int r=0;r<NB;r++) for(size_t off=0; off<B; off+=C, j++){ size_t len=std::min(C,B-off); int k=j%R; if(used[k]) cudaEventSynchronize(ev[k]);
        pool.copy(ring+k*C,src+r*B+off,len,false); cudaMemcpyAsync((char*)dev+(r%2)*B+off,ring+k*C,len,cudaMemcpyHostToDevice,st); cudaEventRecord(ev[k],st); used[k]=true; }
      cudaStreamSynchronize(st); printf("chunked T=%d C=%zuMB R=%d %.1f GB/s\n",T,C>>20,R,total/(now()-t0)/1e9); }
    return 0; }
  for(int T: {8,12,14}){ Pool pool(T);
    for(int nt=0;nt<2;nt++){ double t0=now(); for(int r=0;r<NB;r++) pool.copy(pin+(r%2)*B,src+r*B,B,nt); printf("copy alone T=%d nt=%d %.1f GB/s\n",T,nt,total/(now()-t0)/1e9); }
    // whole-block pipeline, 2 staging buffers
    for(int nt=0;nt<2;nt++){ cudaEvent_t ev[2]; for(auto&e:ev) cudaEventCreateWithFlags(&e,cudaEventDisableTiming); bool used[2]={0,0};
      double t0=now(); for(int r=0;r<NB;r++){ int k=r%2; if(used[k]) cudaEventSynchronize(ev[k]); pool.copy(pin+k*B,src+r*B,B,nt);
        cudaMemcpyAsync((char*)dev+(r%2)*B,pin+k*B,B,cudaMemcpyHostToDevice,st); cudaEventRecord(ev[k],st); used[k]=1; }
      cudaStreamSynchronize(st); printf("block pipeline T=%d nt=%d %.1f GB/s\n",T,nt,total/(now()-t0)/1e9); for(auto&e:ev) cudaEventDestroy(e); }
    // chunked pipeline through a ring of R chunks of C bytes
    for(size_t C: {1ul<<20, 2ul<<20, 4ul<<20, 8ul<<20, 16ul<<20, 32ul<<20}) for(int R: {4, 8}) for(int nt=0;nt<2;nt++){
      char* ring; cudaHostAlloc((void**)&ring,C*R,0); memset(ring,0,C*R);
      std::vector<cudaEvent_t> ev(R); for(auto&e:ev) cudaEventCreateWithFlags(&e,cudaEventDisableTiming); std::vector<bool> used(R,false);
      double t0=now(); size_t j=0;
      for(int r=0;r<NB;r++) for(size_t off=0; off<B; off+=C, j++){ size_t len=std::min(C,B-off); int k=j%R; if(used[k]) cudaEventSynchronize(ev[k]);
        pool.copy(ring+k*C,src+r*B+off,len,nt); cudaMemcpyAsync((char*)dev+(r%2)*B+off,ring+k*C,len,cudaMemcpyHostToDevice,st); cudaEventRecord(ev[k],st); used[k]=true; }
      cudaStreamSynchronize(st); printf("chunked T=%d C=%zuMB R=%d nt=%d %.1f GB/s\n",T,C>>20,R,nt,total/(now()-t0)/1e9);
      for(auto&e:ev) cudaEventDestroy(e); cudaFreeHost(ring); }
  }
  return 0; }
