//! What a file type is, in words, for the messages of both binaries that
//! refuse a file of the wrong kind (`busd`'s `regular.rs` and `socket.rs`,
//! `dws`'s `files.rs`).

use std::os::unix::fs::FileTypeExt;

/// `ft` in words: "a FIFO", "a directory", "a regular file", …
pub fn describe(ft: std::fs::FileType) -> &'static str {
    if ft.is_symlink() {
        "a symbolic link"
    } else if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_file() {
        "a regular file"
    } else {
        "of an unknown kind"
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_file_type_in_words() {
        let t = |p: &str| super::describe(std::fs::symlink_metadata(p).unwrap().file_type());
        assert_eq!(t("/"), "a directory");
        assert_eq!(t("/dev/null"), "a character device");
    }
}
