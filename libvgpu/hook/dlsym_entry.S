/*
 * dlsym_entry.S - the dlsym every caller in the process gets.
 *
 * dlsym(RTLD_NEXT, name) means "the next definition after the object that
 * called dlsym", and glibc takes that object from its own return address.
 * So for a name the hook does not wrap, the real dlsym must be entered with
 * the caller's return address still in place: a jump, not a call. C cannot
 * promise that (a tail call is the optimiser's choice, and at -O0 there is
 * none), so this entry is written in assembly:
 *
 *   1. keep the arguments, and call
 *        dlsym_fn vgpu_dlsym_route(handle, name, caller, &answer)
 *      with caller = our return address (interpose.c);
 *   2. it returns the real dlsym: restore the arguments and the stack as
 *      they were at entry, and jump there; the real dlsym sees our caller
 *      and returns straight to it;
 *   3. or it returns NULL: the answer (a wrapped driver name, looked up by
 *      the hook) is in `answer`; return it.
 *
 * dlvsym has an entry of the same shape (a program asking dlvsym for the
 * real dlsym would otherwise walk past the hook): vgpu_dlvsym_route.
 *
 * One entry per architecture the project builds for, chosen by the
 * compiler's own target macros.
 */

#if defined(__x86_64__)

        .text
        .globl  dlsym
        .type   dlsym, @function
        .p2align 4
dlsym:
        .cfi_startproc
#if defined(__CET__) && (__CET__ & 1)
        endbr64
#endif
        pushq   %rdi                    /* handle */
        .cfi_adjust_cfa_offset 8
        pushq   %rsi                    /* name */
        .cfi_adjust_cfa_offset 8
        subq    $24, %rsp               /* answer at 0(%rsp); %rsp 16-aligned */
        .cfi_adjust_cfa_offset 24
        movq    40(%rsp), %rdx          /* caller: our return address */
        movq    %rsp, %rcx              /* &answer */
        call    vgpu_dlsym_route
        testq   %rax, %rax
        jz      1f
        .cfi_remember_state
        addq    $24, %rsp
        .cfi_adjust_cfa_offset -24
        popq    %rsi
        .cfi_adjust_cfa_offset -8
        popq    %rdi
        .cfi_adjust_cfa_offset -8
        jmp     *%rax                   /* the real dlsym, as if called by our caller */
        .cfi_restore_state
1:      movq    (%rsp), %rax
        addq    $40, %rsp
        .cfi_adjust_cfa_offset -40
        ret
        .cfi_endproc
        .size   dlsym, .-dlsym
        .globl  vgpu_dlsym_entry
        .hidden vgpu_dlsym_entry
        .set    vgpu_dlsym_entry, dlsym

/* dlvsym(handle, name, version): the same, with
 *   vgpu_dlvsym_route(handle, name, version, caller, &answer). */
        .globl  dlvsym
        .type   dlvsym, @function
        .p2align 4
dlvsym:
        .cfi_startproc
#if defined(__CET__) && (__CET__ & 1)
        endbr64
#endif
        pushq   %rdi                    /* handle */
        .cfi_adjust_cfa_offset 8
        pushq   %rsi                    /* name */
        .cfi_adjust_cfa_offset 8
        pushq   %rdx                    /* version */
        .cfi_adjust_cfa_offset 8
        subq    $16, %rsp               /* answer at 0(%rsp); %rsp 16-aligned */
        .cfi_adjust_cfa_offset 16
        movq    40(%rsp), %rcx          /* caller: our return address */
        movq    %rsp, %r8               /* &answer */
        call    vgpu_dlvsym_route
        testq   %rax, %rax
        jz      1f
        .cfi_remember_state
        addq    $16, %rsp
        .cfi_adjust_cfa_offset -16
        popq    %rdx
        .cfi_adjust_cfa_offset -8
        popq    %rsi
        .cfi_adjust_cfa_offset -8
        popq    %rdi
        .cfi_adjust_cfa_offset -8
        jmp     *%rax                   /* the real dlvsym, as if called by our caller */
        .cfi_restore_state
1:      movq    (%rsp), %rax
        addq    $40, %rsp
        .cfi_adjust_cfa_offset -40
        ret
        .cfi_endproc
        .size   dlvsym, .-dlvsym
        .globl  vgpu_dlvsym_entry
        .hidden vgpu_dlvsym_entry
        .set    vgpu_dlvsym_entry, dlvsym

#elif defined(__aarch64__)

        .text
        .globl  dlsym
        .type   dlsym, %function
        .p2align 4
dlsym:
        .cfi_startproc
#if defined(__ARM_FEATURE_BTI_DEFAULT)
        hint    34                      /* bti c */
#endif
        stp     x29, x30, [sp, #-48]!   /* frame; x30 is the caller's return */
        .cfi_def_cfa_offset 48
        .cfi_offset 29, -48
        .cfi_offset 30, -40
        mov     x29, sp
        stp     x0, x1, [sp, #16]       /* handle, name */
        mov     x2, x30                 /* caller */
        add     x3, sp, #32             /* &answer */
        bl      vgpu_dlsym_route
        cbz     x0, 1f
        .cfi_remember_state
        mov     x16, x0                 /* x16: a BTI-compatible indirect branch */
        ldp     x0, x1, [sp, #16]
        ldp     x29, x30, [sp], #48
        .cfi_def_cfa_offset 0
        .cfi_restore 29
        .cfi_restore 30
        br      x16                     /* the real dlsym, as if called by our caller */
        .cfi_restore_state
1:      ldr     x0, [sp, #32]
        ldp     x29, x30, [sp], #48
        .cfi_def_cfa_offset 0
        .cfi_restore 29
        .cfi_restore 30
        ret
        .cfi_endproc
        .size   dlsym, .-dlsym
        .globl  vgpu_dlsym_entry
        .hidden vgpu_dlsym_entry
        .set    vgpu_dlsym_entry, dlsym

        .globl  dlvsym
        .type   dlvsym, %function
        .p2align 4
dlvsym:
        .cfi_startproc
#if defined(__ARM_FEATURE_BTI_DEFAULT)
        hint    34                      /* bti c */
#endif
        stp     x29, x30, [sp, #-48]!   /* frame; x30 is the caller's return */
        .cfi_def_cfa_offset 48
        .cfi_offset 29, -48
        .cfi_offset 30, -40
        mov     x29, sp
        stp     x0, x1, [sp, #16]       /* handle, name */
        str     x2, [sp, #32]           /* version */
        mov     x3, x30                 /* caller */
        add     x4, sp, #40             /* &answer */
        bl      vgpu_dlvsym_route
        cbz     x0, 1f
        .cfi_remember_state
        mov     x16, x0                 /* x16: a BTI-compatible indirect branch */
        ldp     x0, x1, [sp, #16]
        ldr     x2, [sp, #32]
        ldp     x29, x30, [sp], #48
        .cfi_def_cfa_offset 0
        .cfi_restore 29
        .cfi_restore 30
        br      x16                     /* the real dlvsym, as if called by our caller */
        .cfi_restore_state
1:      ldr     x0, [sp, #40]
        ldp     x29, x30, [sp], #48
        .cfi_def_cfa_offset 0
        .cfi_restore 29
        .cfi_restore 30
        ret
        .cfi_endproc
        .size   dlvsym, .-dlvsym
        .globl  vgpu_dlvsym_entry
        .hidden vgpu_dlvsym_entry
        .set    vgpu_dlvsym_entry, dlvsym

#else
#error "dlsym_entry.S: no dlsym entry for this architecture (x86_64 and aarch64 have one)"
#endif

#if defined(__aarch64__) && defined(__ARM_FEATURE_BTI_DEFAULT)
/* Mark the object BTI-compatible, as the compiler marks C objects built with
 * -mbranch-protection, so the library keeps its marking. */
        .pushsection .note.gnu.property, "a"
        .p2align 3
        .word   4, 16, 5                /* name size, desc size, NT_GNU_PROPERTY_TYPE_0 */
        .asciz  "GNU"
        .word   0xc0000000              /* GNU_PROPERTY_AARCH64_FEATURE_1_AND */
        .word   4
        .word   1                       /* BTI */
        .word   0
        .popsection
#endif
#if defined(__x86_64__) && defined(__CET__)
/* The same for CET (-fcf-protection): IBT and SHSTK as the compiler says. */
        .pushsection .note.gnu.property, "a"
        .p2align 3
        .long   4, 16, 5                /* name size, desc size, NT_GNU_PROPERTY_TYPE_0 */
        .asciz  "GNU"
        .long   0xc0000002              /* GNU_PROPERTY_X86_FEATURE_1_AND */
        .long   4
        .long   __CET__                 /* 1: IBT, 2: SHSTK */
        .long   0
        .popsection
#endif

/* No executable stack. */
        .section .note.GNU-stack, "", %progbits
