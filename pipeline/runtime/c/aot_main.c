/* A program running one AOT model (pipeline/link/aot.py) on files: the test
 * firmware of a bare-metal target (files and exit code through semihosting,
 * picolibc's --oslib=semihost) and the host's check of lib<m>.a.
 *
 * Reads input_<i>.bin (the raw bytes of input i, in the header's table order)
 * from the current folder, runs the model once, writes output_<i>.bin; the exit
 * status is 0, 2 for a missing or short input file or a failed write, or the
 * kernel's non-zero return code. Compiled with
 *   -DPL_MODEL=<c name> -DPL_NUM_INPUTS=n -DPL_NUM_OUTPUTS=n -DPL_IO_SIZE=bytes
 *   -include <c name>.h [-DPL_SEMIHOST_EXIT]
 * PL_SEMIHOST_EXIT ends the program with semihosting SYS_EXIT_EXTENDED, which
 * makes qemu-system exit with the program's status (picolibc's exit does not):
 * on Arm through `bkpt 0xab`, on RISC-V through the slli/ebreak/srai sequence.
 * PL_COUNT_TICKS (an M-profile board) prints "ticks: N", the SysTick ticks of the
 * processor clock the model's run took (pipeline/tools/board_count.py: under
 * qemu -icount shift=0 a tick is a fixed number of executed instructions). */
#include <stdint.h>
#include <stdio.h>

#define PL_CAT2(a, b) a##b
#define PL_CAT(a, b) PL_CAT2(a, b)
#define PL_SYM(suffix) PL_CAT(PL_CAT(tvmgen_, PL_MODEL), suffix)
#define PL_ALIGN 16

/* Inputs and outputs, each on a PL_ALIGN boundary. */
static uint8_t io[PL_IO_SIZE + PL_ALIGN * (PL_NUM_INPUTS + PL_NUM_OUTPUTS) + 1]
    __attribute__((aligned(PL_ALIGN)));

#ifdef PL_SEMIHOST_EXIT
static void finish(int status) {
    /* SYS_EXIT_EXTENDED (0x20): {ADP_Stopped_ApplicationExit, status}. */
    uint32_t block[2] = {0x20026u, (uint32_t)status};
#ifdef __riscv
    /* The RISC-V semihosting trap: three uncompressed instructions the debugger
     * (qemu) recognises around the ebreak, kept on one page by the alignment. */
    register uint32_t r0 __asm__("a0") = 0x20u;
    register uint32_t *r1 __asm__("a1") = block;
    __asm__ volatile(".balign 16\n.option push\n.option norvc\n"
                     "slli zero, zero, 0x1f\nebreak\nsrai zero, zero, 7\n.option pop"
                     : "+r"(r0) : "r"(r1) : "memory");
#else
    register uint32_t r0 __asm__("r0") = 0x20u;
    register uint32_t *r1 __asm__("r1") = block;
    __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
#endif
    for (;;) {
    }
}
#else
#define finish(status) return (status)
#endif

#ifdef PL_COUNT_TICKS
/* SysTick: SYST_CSR, SYST_RVR, SYST_CVR, counting the processor clock down from
 * 2^24 - 1 (a run of more ticks than that would wrap: not counted). */
#define PL_SYST ((volatile uint32_t *)0xE000E010u)
static uint32_t ticks_start(void) {
    PL_SYST[1] = 0xFFFFFFu;
    PL_SYST[2] = 0u;
    PL_SYST[0] = 5u; /* enabled, processor clock, no interrupt */
    return PL_SYST[2];
}
#endif

static int transfer(const char *kind, int index, void *data, uint32_t bytes, int writing) {
    char name[32];
    snprintf(name, sizeof name, "%s_%d.bin", kind, index);
    FILE *f = fopen(name, writing ? "wb" : "rb");
    if (!f) {
        printf("error: cannot open %s\n", name);
        return 2;
    }
    size_t done = writing ? fwrite(data, 1, bytes, f) : fread(data, 1, bytes, f);
    fclose(f);
    if (done != bytes) {
        printf("error: %s: %u of %u bytes\n", name, (unsigned)done, (unsigned)bytes);
        return 2;
    }
    return 0;
}

int main(void) {
    void *inputs[PL_NUM_INPUTS + 1], *outputs[PL_NUM_OUTPUTS + 1];
    uint32_t at = 0;
    int status = 0;
    for (int i = 0; i < PL_NUM_INPUTS && !status; i++) {
        inputs[i] = io + at;
        at += (PL_SYM(_input_bytes)[i] + PL_ALIGN - 1) / PL_ALIGN * PL_ALIGN;
        status = transfer("input", i, inputs[i], PL_SYM(_input_bytes)[i], 0);
    }
    for (int i = 0; i < PL_NUM_OUTPUTS; i++) {
        outputs[i] = io + at;
        at += (PL_SYM(_output_bytes)[i] + PL_ALIGN - 1) / PL_ALIGN * PL_ALIGN;
    }
    if (!status) {
#ifdef PL_COUNT_TICKS
        uint32_t start = ticks_start();
        int32_t rc = PL_SYM(_run_arrays)(inputs, outputs);
        printf("ticks: %lu\n", (unsigned long)((start - PL_SYST[2]) & 0xFFFFFFu));
#else
        int32_t rc = PL_SYM(_run_arrays)(inputs, outputs);
#endif
        if (rc != 0) {
            printf("error: the model returned %d\n", (int)rc);
            status = (int)rc;
        }
    }
    for (int i = 0; i < PL_NUM_OUTPUTS && !status; i++)
        status = transfer("output", i, outputs[i], PL_SYM(_output_bytes)[i], 1);
    finish(status);
}
