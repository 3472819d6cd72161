/* Test harness only, never shipped: Wine 8.0 (Debian 12) has no bcryptprimitives.dll, whose ProcessPrng Rust's
 * standard library imports on Windows 10 and newer (every Windows that Framesmith supports has it). The smoke test
 * builds this stand-in with mingw-w64 and puts it in the wine prefix's system32. It fills the buffer from
 * RtlGenRandom (advapi32's SystemFunction036), which Wine implements. */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T length)
{
    while (length > 0) {
        ULONG chunk = length > 0x40000000 ? 0x40000000 : (ULONG)length;
        if (!SystemFunction036(data, chunk))
            return FALSE;
        data += chunk;
        length -= chunk;
    }
    return TRUE;
}
