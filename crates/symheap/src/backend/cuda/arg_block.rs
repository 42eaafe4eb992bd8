//! Kernel argument blocks: every kernel of symheap's own programs (kernels.cu, coll.cu) takes one
//! parameter, a C struct passed by value, mirrored here by a `#[repr(C)]` struct declared with
//! [`arg_block!`]. The Rust side is the reference: [`layout_header`] turns the Rust layout (every
//! field's offset and size, from `offset_of!`) into `static_assert`s that are prepended to the
//! program's source, and the `.cu` side expands them right after its structs, so a `.cu` struct
//! that drifts from its Rust twin fails the NVRTC compile (in `cargo test`, in `symheap kernels`
//! for the wheel, and at run time), naming the field.
//!
//! A kernel handle is typed by its block ([`Kernel`]), so a launch cannot pass another kernel's
//! arguments, and its arguments are named fields instead of a hand-ordered list.

use std::ffi::c_void;
use std::fmt::Write as _;
use std::marker::PhantomData;

use super::driver::{self, Function, Module};
use crate::error::Result;

/// One field of an argument block as Rust lays it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    /// The field's name, the same on both sides.
    pub name: &'static str,
    /// Byte offset from the start of the block.
    pub offset: usize,
    /// Size in bytes.
    pub size: usize,
}

/// A kernel's argument block: a `#[repr(C)]` struct of plain integers (and nested blocks), with
/// no implicit padding, mirrored by the C struct [`ArgBlock::C_NAME`] of the kernel source.
///
/// # Safety
/// Implement it only through [`arg_block!`], which makes the struct `#[repr(C)]` and `Copy`,
/// refuses implicit padding at compile time, and lists every field with its real offset and size.
pub unsafe trait ArgBlock: Copy + 'static {
    /// The C struct's name in the kernel source (with its namespace).
    const C_NAME: &'static str;
    /// Every field, in declaration order.
    const FIELDS: &'static [Field];
}

/// Declares a `#[repr(C)]` argument block and its [`ArgBlock`] description. Field names are the
/// C struct's; fields are `u64` (addresses and sizes), `i32`/`u32`, or another block.
macro_rules! arg_block {
    (
        $(#[$meta:meta])*
        pub struct $name:ident as $cname:literal {
            $( $(#[$fmeta:meta])* pub $field:ident : $ty:ty ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty ),*
        }

        // No implicit padding: every byte the driver copies to the device is a field's.
        const _: () = assert!(
            0 $(+ ::core::mem::size_of::<$ty>())* == ::core::mem::size_of::<$name>(),
            concat!(stringify!($name), " has implicit padding: add an explicit field")
        );

        // SAFETY: `#[repr(C)]`, `Copy`, no padding (checked above), and FIELDS lists every field
        // with the offset and size the compiler gave it.
        unsafe impl $crate::backend::cuda::arg_block::ArgBlock for $name {
            const C_NAME: &'static str = $cname;
            const FIELDS: &'static [$crate::backend::cuda::arg_block::Field] = &[$(
                $crate::backend::cuda::arg_block::Field {
                    name: stringify!($field),
                    offset: ::core::mem::offset_of!($name, $field),
                    size: ::core::mem::size_of::<$ty>(),
                }
            ),*];
        }
    };
}
pub(crate) use arg_block;

/// The layout of `A` as seen from C: its name, size, alignment and fields.
#[derive(Debug, Clone, Copy)]
pub struct BlockLayout {
    /// The C struct's name.
    pub c_name: &'static str,
    /// `sizeof` in bytes.
    pub size: usize,
    /// `alignof` in bytes.
    pub align: usize,
    /// Every field.
    pub fields: &'static [Field],
}

/// `A`'s layout.
pub fn layout<A: ArgBlock>() -> BlockLayout {
    BlockLayout {
        c_name: A::C_NAME,
        size: std::mem::size_of::<A>(),
        align: std::mem::align_of::<A>(),
        fields: A::FIELDS,
    }
}

/// The macro that names the layout checks in a program's source.
pub const LAYOUT_MACRO: &str = "SYMHEAP_ARG_LAYOUT";

/// The text prepended to a kernel program: `SYMHEAP_ARG_LAYOUT`, a macro of `static_assert`s
/// that every block in `blocks` has, in C, the size, alignment, field offsets and field sizes it
/// has in Rust. The program expands it after its structs (and refuses to compile without it).
/// Offsets use EDG's `__INTADDR__`, which NVRTC's front end accepts in constant expressions
/// (it has neither `offsetof` nor `__builtin_offsetof`).
pub fn layout_header(blocks: &[BlockLayout]) -> String {
    let mut asserts = Vec::new();
    for b in blocks {
        let c = b.c_name;
        asserts.push(format!(
            "static_assert(sizeof({c}) == {} && alignof({c}) == {}, \"{c}: Rust lays it out in {} bytes aligned to {}\");",
            b.size, b.align, b.size, b.align
        ));
        for f in b.fields {
            let (name, off, size) = (f.name, f.offset, f.size);
            asserts.push(format!(
                "static_assert(SYMHEAP_ARG_OFFSET({c}, {name}) == {off} && sizeof((({c}*)0)->{name}) == {size}, \"{c}::{name}: Rust puts {size} bytes at offset {off}\");"
            ));
        }
    }
    let mut h = String::from(
        "// Generated by symheap (backend/cuda/arg_block.rs): the kernels' argument blocks as\n\
         // Rust lays them out. A .cu struct that differs does not compile.\n\
         #define SYMHEAP_ARG_OFFSET(T, m) ((unsigned long long)__INTADDR__(&(((T*)0)->m)))\n",
    );
    let _ = write!(h, "#define {LAYOUT_MACRO}");
    for a in &asserts {
        let _ = write!(h, " \\\n  {a}");
    }
    h.push('\n');
    h
}

/// A kernel whose one parameter is the argument block `A`.
pub(crate) struct Kernel<A> {
    f: Function,
    _args: PhantomData<fn(&A)>,
}

impl<A> Clone for Kernel<A> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<A> Copy for Kernel<A> {}

impl<A: ArgBlock> Kernel<A> {
    /// Looks up `symbol` in `module`.
    ///
    /// # Safety
    /// `symbol`'s one parameter is `A`'s C struct, by value (every kernel of symheap's programs
    /// is checked so by nvrtc_compile's `every_kernel_takes_its_argument_block`); `module`
    /// stays loaded while the handle is used.
    pub(crate) unsafe fn load(module: &Module, symbol: &str) -> Result<Kernel<A>> {
        Ok(Kernel {
            f: module.function(symbol)?,
            _args: PhantomData,
        })
    }

    /// Launches a 1-D grid on `stream` with `args`.
    ///
    /// # Safety
    /// Every address in `args` is valid for every access the kernel makes with it (as its source
    /// describes), and `stream` is a live stream of the module's context.
    pub(crate) unsafe fn launch(
        &self,
        grid: u32,
        block: u32,
        shared: u32,
        stream: u64,
        args: &A,
    ) -> Result<()> {
        let param = (args as *const A).cast::<c_void>();
        // SAFETY: the kernel takes exactly `A`'s C struct (`load`'s contract), whose layout is
        // `A`'s (the program's layout checks); `param` points at a live `A`; the addresses are
        // the caller's promise.
        unsafe { driver::launch_block(self.f, grid, block, shared, stream, param) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    arg_block! {
        /// A block for the tests.
        pub struct Probe as "t::Probe" {
            /// First.
            pub a: u64,
            /// Second.
            pub b: i32,
            /// Third.
            pub c: u32,
            /// Fourth.
            pub d: u64,
        }
    }

    arg_block! {
        /// A block holding another.
        pub struct Outer as "t::Outer" {
            /// A word.
            pub x: u64,
            /// The nested block.
            pub inner: Probe,
        }
    }

    #[test]
    fn fields_carry_the_compilers_offsets() {
        assert_eq!(
            Probe::FIELDS,
            &[
                Field {
                    name: "a",
                    offset: 0,
                    size: 8
                },
                Field {
                    name: "b",
                    offset: 8,
                    size: 4
                },
                Field {
                    name: "c",
                    offset: 12,
                    size: 4
                },
                Field {
                    name: "d",
                    offset: 16,
                    size: 8
                },
            ]
        );
        let l = layout::<Outer>();
        assert_eq!((l.c_name, l.size, l.align), ("t::Outer", 32, 8));
        assert_eq!(
            l.fields[1],
            Field {
                name: "inner",
                offset: 8,
                size: 24
            }
        );
    }

    #[test]
    fn the_header_asserts_every_field() {
        let h = layout_header(&[layout::<Probe>(), layout::<Outer>()]);
        assert!(h.contains("#define SYMHEAP_ARG_LAYOUT \\\n"), "{h}");
        for needle in [
            "sizeof(t::Probe) == 24 && alignof(t::Probe) == 8",
            "SYMHEAP_ARG_OFFSET(t::Probe, c) == 12 && sizeof(((t::Probe*)0)->c) == 4",
            "SYMHEAP_ARG_OFFSET(t::Outer, inner) == 8 && sizeof(((t::Outer*)0)->inner) == 24",
            "\"t::Probe::d: Rust puts 8 bytes at offset 16\"",
        ] {
            assert!(h.contains(needle), "no {needle:?} in\n{h}");
        }
        // One macro: every assert line but the last continues it.
        let body: Vec<&str> = h
            .lines()
            .skip_while(|l| !l.starts_with("#define SYMHEAP_ARG_LAYOUT"))
            .collect();
        assert_eq!(body.len(), 1 + (1 + 4) + (1 + 2), "{h}");
        assert!(body[..body.len() - 1].iter().all(|l| l.ends_with('\\')));
        assert!(!body[body.len() - 1].ends_with('\\'));
    }
}
