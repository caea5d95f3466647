//! The bus's private directories and files against planted ones (a careless
//! or hostile local client): the work dir `<cfg>/events/<profile>` and its
//! parent `events/` must be real directories, ours, not group/world writable;
//! a symlink at `bus.lock`, `bus.log` or `bus.meta.tmp` is refused and its
//! target never touched; the socket dir follows the same rule. Every refusal
//! is a permission failure: `dws` prints one `Error: cannot start the bus: …`
//! line naming the path and exits 3. Fixing the problem makes the same
//! command work.

use std::{
    fs,
    os::unix::fs::{symlink, DirBuilderExt, MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
};

use dws_tests::{Output, TestEnv, EXIT_TIMEOUT};

/// `dws event publish k.x v`: the command that spawns a bus on demand.
fn publish(env: &TestEnv) -> Output {
    env.dws(["event", "publish", "k.x", "v"])
        .run_with_timeout(EXIT_TIMEOUT)
}

/// Asserts a refused start: exit 3, one `Error: cannot start the bus: …`
/// line that names `path` and contains `why`; no bus left running.
fn assert_refused(env: &TestEnv, out: &Output, path: &Path, why: &str) {
    let line = out.assert_error(3);
    assert!(
        line.starts_with("Error: cannot start the bus: "),
        "{line:?}\n{out}"
    );
    assert!(
        line.contains(&path.display().to_string()),
        "the error names {}\n{out}",
        path.display()
    );
    assert!(line.contains(why), "the error says {why:?}\n{out}");
    env.wait_no_busd(EXIT_TIMEOUT, "the refused bus to exit");
}

/// Creates `<cfg>/events/default` (and `events/`) 0700, as busd would.
fn make_work_dir(env: &TestEnv) -> PathBuf {
    let dir = env.work_dir();
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .expect("create work dir");
    dir
}

/// A file outside the work dir with known contents and mode, and a symlink
/// to it planted at `<work dir>/<name>`.
struct Planted {
    link: PathBuf,
    target: PathBuf,
    contents: Vec<u8>,
    mode: u32,
}

impl Planted {
    fn new(env: &TestEnv, name: &str) -> Planted {
        let dir = make_work_dir(env);
        let target = env.root().join(format!("victim-{name}"));
        let contents = format!("precious contents of {name}\n").into_bytes();
        fs::write(&target, &contents).expect("write target");
        fs::set_permissions(&target, fs::Permissions::from_mode(0o640)).expect("chmod target");
        let link = dir.join(name);
        symlink(&target, &link).expect("plant symlink");
        Planted {
            link,
            target,
            contents,
            mode: 0o640,
        }
    }

    fn assert_target_untouched(&self, out: &Output) {
        assert_eq!(
            fs::read(&self.target).expect("read target"),
            self.contents,
            "the target of {} was modified\n{out}",
            self.link.display()
        );
        let mode = fs::metadata(&self.target).expect("stat target").mode() & 0o7777;
        assert_eq!(
            mode,
            self.mode,
            "the target of {} was chmodded\n{out}",
            self.link.display()
        );
    }
}

/// Plants a symlink at `name`, checks the refusal, removes the link, checks
/// that the bus starts.
fn planted_symlink_is_refused(name: &str) {
    let env = TestEnv::new();
    let planted = Planted::new(&env, name);
    let out = publish(&env);
    assert_refused(&env, &out, &planted.link, "symbolic link");
    planted.assert_target_untouched(&out);
    assert!(
        fs::symlink_metadata(&planted.link)
            .expect("the link is still there")
            .is_symlink(),
        "a planted link is refused, not removed\n{out}"
    );

    fs::remove_file(&planted.link).expect("remove the planted link");
    env.publish("k.x", "v", &[]);
    planted.assert_target_untouched(&out);
    // The bus created its own regular file instead (bus.meta.tmp became bus.meta).
    let own = match name {
        "bus.meta.tmp" => env.work_dir().join("bus.meta"),
        _ => planted.link.clone(),
    };
    let ft = fs::symlink_metadata(&own).map(|m| m.file_type());
    assert!(
        ft.as_ref().is_ok_and(|t| t.is_file()),
        "{} is a regular file: {ft:?}",
        own.display()
    );
}

#[test]
fn a_symlink_planted_at_bus_lock_is_refused_and_its_target_untouched() {
    planted_symlink_is_refused("bus.lock");
}

#[test]
fn a_symlink_planted_at_bus_log_is_refused_and_its_target_untouched() {
    planted_symlink_is_refused("bus.log");
}

#[test]
fn a_symlink_planted_at_bus_meta_tmp_is_refused_and_its_target_untouched() {
    planted_symlink_is_refused("bus.meta.tmp");
}

/// A stale regular `bus.meta.tmp` (a bus died between writing and renaming
/// it) is not a problem: it is replaced.
#[test]
fn a_stale_regular_bus_meta_tmp_is_replaced() {
    let env = TestEnv::new();
    let tmp = make_work_dir(&env).join("bus.meta.tmp");
    fs::write(&tmp, "{\"pid\": 1, \"truncated").expect("write stale tmp");
    env.publish("k.x", "v", &[]);
    assert!(env.bus_meta_pid().is_some(), "bus.meta is valid JSON");
    assert!(!tmp.exists(), "bus.meta.tmp was renamed to bus.meta");
    let mode = fs::metadata(env.work_dir().join("bus.meta"))
        .expect("bus.meta")
        .mode();
    assert_eq!(mode & 0o777, 0o600, "bus.meta mode {mode:o}");
}

#[test]
fn busd_creates_the_work_dir_and_events_dir_0700() {
    let env = TestEnv::new();
    env.publish("k.x", "v", &[]);
    for dir in [env.cfg_dir().join("events"), env.work_dir()] {
        let mode = fs::symlink_metadata(&dir).expect("stat").mode() & 0o7777;
        assert_eq!(mode, 0o700, "{} mode {mode:o}", dir.display());
    }
}

#[test]
fn a_world_writable_work_dir_is_refused_until_chmod_700() {
    let env = TestEnv::new();
    let dir = make_work_dir(&env);
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).expect("chmod 777");
    let out = publish(&env);
    assert_refused(&env, &out, &dir, "group or world writable (mode 0777)");
    assert_eq!(
        fs::metadata(&dir).expect("stat").mode() & 0o7777,
        0o777,
        "a loose work dir is refused, not silently chmodded\n{out}"
    );
    assert!(
        fs::read_dir(&dir).expect("list").next().is_none(),
        "nothing was created in the refused work dir\n{out}"
    );

    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).expect("chmod 700");
    env.publish("k.x", "v", &[]);
}

#[test]
fn a_group_writable_events_dir_is_refused() {
    let env = TestEnv::new();
    let events = make_work_dir(&env).parent().expect("events").to_path_buf();
    fs::set_permissions(&events, fs::Permissions::from_mode(0o770)).expect("chmod 770");
    let out = publish(&env);
    assert_refused(&env, &out, &events, "group or world writable (mode 0770)");

    fs::set_permissions(&events, fs::Permissions::from_mode(0o700)).expect("chmod 700");
    env.publish("k.x", "v", &[]);
}

#[test]
fn a_symlinked_events_dir_is_refused_and_nothing_is_written_through_it() {
    let env = TestEnv::new();
    let elsewhere = env.root().join("elsewhere");
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&elsewhere)
        .expect("mkdir elsewhere");
    let events = env.cfg_dir().join("events");
    symlink(&elsewhere, &events).expect("plant events symlink");
    let out = publish(&env);
    assert_refused(&env, &out, &events, "symbolic link");
    assert!(
        fs::read_dir(&elsewhere).expect("list").next().is_none(),
        "nothing was created through the symlinked events dir\n{out}"
    );

    fs::remove_file(&events).expect("remove the link");
    env.publish("k.x", "v", &[]);
    assert!(
        fs::read_dir(&elsewhere).expect("list").next().is_none(),
        "the bus did not use the link's target"
    );
}

#[test]
fn a_symlinked_work_dir_is_refused() {
    let env = TestEnv::new();
    let dir = make_work_dir(&env);
    fs::remove_dir(&dir).expect("rmdir");
    let elsewhere = env.root().join("elsewhere");
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&elsewhere)
        .expect("mkdir elsewhere");
    symlink(&elsewhere, &dir).expect("plant work dir symlink");
    let out = publish(&env);
    assert_refused(&env, &out, &dir, "symbolic link");
    assert!(
        fs::read_dir(&elsewhere).expect("list").next().is_none(),
        "{out}"
    );
}

#[test]
fn a_work_dir_owned_by_another_uid_is_refused() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root to chown the work dir to another uid");
        return;
    }
    let env = TestEnv::new();
    let dir = make_work_dir(&env);
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).expect("chown 65534");
    let out = publish(&env);
    assert_refused(&env, &out, &dir, "owned by uid 65534");

    let me = nix::unistd::geteuid().as_raw();
    std::os::unix::fs::chown(&dir, Some(me), None).expect("chown back");
    env.publish("k.x", "v", &[]);
}

/// The socket dir has the same rule and the same classification (exit 3).
#[test]
fn a_refused_socket_dir_is_a_permission_failure() {
    let env = TestEnv::new();
    let uid = nix::unistd::geteuid().as_raw();
    let sock_dir = env.run_dir().join(format!("dws-event-{uid}"));
    assert_eq!(
        Some(sock_dir.as_path()),
        env.expected_socket_path().parent(),
        "socket dir of this env"
    );

    fs::DirBuilder::new()
        .mode(0o700)
        .create(&sock_dir)
        .expect("mkdir socket dir");
    fs::set_permissions(&sock_dir, fs::Permissions::from_mode(0o777)).expect("chmod 777");
    let out = publish(&env);
    assert_refused(&env, &out, &sock_dir, "group or world writable");

    fs::remove_dir(&sock_dir).expect("rmdir");
    let elsewhere = env.root().join("elsewhere");
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&elsewhere)
        .expect("mkdir elsewhere");
    symlink(&elsewhere, &sock_dir).expect("plant socket dir symlink");
    let out = publish(&env);
    assert_refused(&env, &out, &sock_dir, "symbolic link");
    assert!(
        fs::read_dir(&elsewhere).expect("list").next().is_none(),
        "no socket was bound through the link\n{out}"
    );

    fs::remove_file(&sock_dir).expect("remove the link");
    env.publish("k.x", "v", &[]);
}
