use super::*;
use k8s_openapi::api::core::v1::PodSpec;

fn pod(uid: &str, host_users: Option<bool>) -> Pod {
    let mut p = Pod::default();
    p.metadata.uid = Some(uid.into());
    p.metadata.name = Some(format!("p-{uid}"));
    p.spec = Some(PodSpec {
        host_users,
        ..Default::default()
    });
    p
}

fn handlers(userns: bool) -> Vec<pb::RuntimeHandler> {
    vec![pb::RuntimeHandler {
        name: String::new(),
        features: Some(pb::RuntimeHandlerFeatures {
            recursive_read_only_mounts: true,
            user_namespaces: userns,
        }),
    }]
}

/// A range of `blocks` blocks starting at block 1 (id 65536).
fn small(blocks: u32) -> KubeletMappings {
    KubeletMappings {
        first_id: USERNS_LENGTH,
        length: USERNS_LENGTH * blocks,
    }
}

fn manager(dir: &Path, blocks: u32) -> UsernsManager {
    UsernsManager::new(dir, small(blocks), 1, USERNS_LENGTH).expect("manager")
}

/// The user namespace a `hostUsers: false` pod with uid `uid` gets.
fn userns_of(m: &UsernsManager, uid: &str, h: &[pb::RuntimeHandler]) -> pb::UserNamespace {
    m.get_or_create(&pod(uid, Some(false)), "", Some(h))
        .unwrap()
}

fn host_of(u: &pb::UserNamespace) -> u32 {
    u.uids[0].host_id
}

#[test]
fn host_users_unset_or_true_share_the_node_namespace() {
    let d = tempfile::tempdir().unwrap();
    let m = manager(d.path(), 4);
    for hu in [None, Some(true)] {
        let u = m.get_or_create(&pod("a", hu), "", None).expect("node mode");
        assert_eq!(u.mode, pb::NamespaceMode::Node as i32, "{hu:?}");
        assert!(u.uids.is_empty() && u.gids.is_empty());
    }
    assert!(
        m.allocated().is_empty(),
        "nothing allocated for host-user pods"
    );
    assert!(!d.path().join("a").exists(), "no file written");
}

#[test]
fn each_pod_gets_its_own_block_and_keeps_it() {
    let d = tempfile::tempdir().unwrap();
    let m = manager(d.path(), 4);
    let h = handlers(true);
    let a = userns_of(&m, "a", &h);
    let b = userns_of(&m, "b", &h);
    assert_eq!(a.mode, pb::NamespaceMode::Pod as i32);
    let want = |host_id| {
        vec![pb::IdMapping {
            host_id,
            container_id: 0,
            length: 65536,
        }]
    };
    assert_eq!(a.uids, want(65536));
    assert_eq!(a.gids, want(65536), "gids mirror uids");
    assert_eq!(b.uids, want(131072), "the second pod gets the next block");
    let again = userns_of(&m, "a", &h);
    assert_eq!(again, a, "the same pod asks again: same block");
    let text = std::fs::read_to_string(d.path().join("a/userns")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        v,
        serde_json::json!({
            "uidMappings": [{"hostId": 65536, "containerId": 0, "length": 65536}],
            "gidMappings": [{"hostId": 65536, "containerId": 0, "length": 65536}],
        }),
        "upstream's field names on disk"
    );
    assert!(
        !d.path().join("a/.userns.tmp").exists(),
        "the temporary file was renamed into place"
    );
}

#[test]
fn a_restarted_manager_reloads_blocks_and_never_reuses_them() {
    let d = tempfile::tempdir().unwrap();
    let h = handlers(true);
    {
        let m = manager(d.path(), 3);
        userns_of(&m, "a", &h);
        userns_of(&m, "b", &h);
        m.release("a");
    }
    // A directory without a file (a host-user pod) is fine.
    std::fs::create_dir_all(d.path().join("plain")).unwrap();
    let m = manager(d.path(), 3);
    assert_eq!(
        m.host_id("b"),
        Some(131072),
        "b's block came back from disk"
    );
    assert_eq!(m.host_id("a"), None, "a was released and its file removed");
    let b = userns_of(&m, "b", &h);
    assert_eq!(host_of(&b), 131072, "b keeps its block across the restart");
    let c = userns_of(&m, "c", &h);
    assert_eq!(host_of(&c), 65536, "the freed block goes to the new pod");
    let e = userns_of(&m, "e", &h);
    assert_eq!(host_of(&e), 196608, "b's block is skipped");
}

#[test]
fn release_frees_the_block_and_removes_the_file() {
    let d = tempfile::tempdir().unwrap();
    let m = manager(d.path(), 1);
    let h = handlers(true);
    userns_of(&m, "a", &h);
    assert!(d.path().join("a/userns").exists());
    m.release("a");
    assert!(!d.path().join("a/userns").exists());
    m.release("a");
    let b = userns_of(&m, "b", &h);
    assert_eq!(host_of(&b), 65536, "the only block is free again");
}

#[test]
fn exhaustion_is_a_clear_error_and_leaves_no_file() {
    let d = tempfile::tempdir().unwrap();
    let m = manager(d.path(), 2);
    let h = handlers(true);
    userns_of(&m, "a", &h);
    userns_of(&m, "b", &h);
    let err = m
        .get_or_create(&pod("c", Some(false)), "", Some(&h))
        .unwrap_err();
    assert_eq!(
        err,
        "create user namespace: could not find an empty slot to allocate a user namespace"
    );
    assert!(!d.path().join("c/userns").exists());
}

#[test]
fn a_corrupt_file_fails_that_pod_only() {
    let d = tempfile::tempdir().unwrap();
    let h = handlers(true);
    {
        let m = manager(d.path(), 3);
        userns_of(&m, "good", &h);
    }
    std::fs::create_dir_all(d.path().join("bad")).unwrap();
    std::fs::write(d.path().join("bad/userns"), "{not json").unwrap();
    std::fs::create_dir_all(d.path().join("two")).unwrap();
    std::fs::write(
        d.path().join("two/userns"),
        r#"{"uidMappings":[{"hostId":65536,"containerId":0,"length":65536},{"hostId":131072,"containerId":0,"length":65536}],"gidMappings":[]}"#,
    )
    .unwrap();
    let m = manager(d.path(), 3);
    assert_eq!(
        m.host_id("good"),
        Some(65536),
        "the good pod's block is back"
    );
    let err = m
        .get_or_create(&pod("bad", Some(false)), "", Some(&h))
        .unwrap_err();
    assert!(
        err.starts_with("user namespace: invalid user namespace mappings file: "),
        "{err}"
    );
    let err = m
        .get_or_create(&pod("two", Some(false)), "", Some(&h))
        .unwrap_err();
    assert_eq!(
        err,
        "user namespace: invalid user namespace configuration: no more than one mapping allowed."
    );
    let other = userns_of(&m, "other", &h);
    assert_eq!(host_of(&other), 131072, "other pods are unaffected");
}

#[test]
fn files_this_kubelet_would_not_write_are_refused() {
    let cases = [
        (
            r#"{"uidMappings":[{"hostId":65536,"containerId":0,"length":65536}],"gidMappings":[{"hostId":131072,"containerId":0,"length":65536}]}"#,
            "user namespace: invalid user namespace configuration: GID and UID mapping should be identical",
        ),
        (
            r#"{"uidMappings":[{"hostId":65536,"containerId":1,"length":65536}],"gidMappings":[{"hostId":65536,"containerId":1,"length":65536}]}"#,
            "user namespace: invalid user namespace configuration: UID 0 must be mapped",
        ),
        (
            r#"{"uidMappings":[{"hostId":65536,"containerId":0,"length":1000}],"gidMappings":[{"hostId":65536,"containerId":0,"length":1000}]}"#,
            "user namespace: wrong user namespace length 1000",
        ),
        (
            r#"{"uidMappings":[{"hostId":65537,"containerId":0,"length":65536}],"gidMappings":[{"hostId":65537,"containerId":0,"length":65536}]}"#,
            "user namespace: wrong user namespace offset specified 65537",
        ),
        (
            r#"{"uidMappings":[{"hostId":0,"containerId":0,"length":65536}],"gidMappings":[{"hostId":0,"containerId":0,"length":65536}]}"#,
            "user namespace: id 0 is out of range",
        ),
        (
            r#"{"uidMappings":[{"hostId":655360,"containerId":0,"length":65536}],"gidMappings":[{"hostId":655360,"containerId":0,"length":65536}]}"#,
            "user namespace: id 655360 is out of range",
        ),
    ];
    for (content, want) in cases {
        let d = tempfile::tempdir().unwrap();
        let m = manager(d.path(), 2);
        std::fs::create_dir_all(d.path().join("p")).unwrap();
        std::fs::write(d.path().join("p/userns"), content).unwrap();
        let err = m
            .get_or_create(&pod("p", Some(false)), "", Some(&handlers(true)))
            .unwrap_err();
        assert_eq!(err, want, "{content}");
    }
}

#[test]
fn two_files_claiming_one_block_fail_the_second_pod() {
    let d = tempfile::tempdir().unwrap();
    let block = r#"{"uidMappings":[{"hostId":65536,"containerId":0,"length":65536}],"gidMappings":[{"hostId":65536,"containerId":0,"length":65536}]}"#;
    for p in ["p1", "p2"] {
        std::fs::create_dir_all(d.path().join(p)).unwrap();
        std::fs::write(d.path().join(p).join("userns"), block).unwrap();
    }
    let m = manager(d.path(), 2);
    let owners: Vec<_> = ["p1", "p2"]
        .into_iter()
        .filter(|p| m.host_id(p).is_some())
        .collect();
    assert_eq!(owners.len(), 1, "exactly one pod owns the block");
    let loser = if owners[0] == "p1" { "p2" } else { "p1" };
    let err = m
        .get_or_create(&pod(loser, Some(false)), "", Some(&handlers(true)))
        .unwrap_err();
    assert_eq!(
        err,
        format!("user namespace: range picked for pod {loser:?} already taken")
    );
}

#[test]
fn a_uid_that_is_not_one_path_component_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let pods = d.path().join("pods");
    let m = manager(&pods, 2);
    for uid in ["", "..", "../escape", "a/b"] {
        let err = m
            .get_or_create(&pod(uid, Some(false)), "", Some(&handlers(true)))
            .unwrap_err();
        assert_eq!(
            err,
            format!("create user namespace: invalid pod uid {uid:?}")
        );
    }
    assert!(!d.path().join("escape").exists());
    assert!(m.allocated().is_empty());
}

#[test]
fn a_handler_without_user_namespaces_is_refused_with_upstreams_message() {
    let d = tempfile::tempdir().unwrap();
    let m = manager(d.path(), 2);
    let p = pod("a", Some(false));
    assert_eq!(
        m.get_or_create(&p, "", Some(&handlers(false))).unwrap_err(),
        "can't set `spec.hostUsers: false`, runtime does not support user namespaces"
    );
    assert_eq!(
        m.get_or_create(&p, "", None).unwrap_err(),
        "can't set `spec.hostUsers: false`, runtime does not support user namespaces: runtime handlers are not set"
    );
    assert_eq!(
        m.get_or_create(&p, "", Some(&[])).unwrap_err(),
        "can't set `spec.hostUsers: false`, runtime does not support user namespaces: the handler \"\" is not known",
        "containerd 1.6 reports no handlers at all"
    );
    assert_eq!(
        m.get_or_create(&p, "crun", Some(&handlers(true)))
            .unwrap_err(),
        "can't set `spec.hostUsers: false`, RuntimeClass handler \"crun\" does not support user namespaces: the handler \"crun\" is not known"
    );
    assert!(m.allocated().is_empty(), "nothing allocated when refused");
}

#[test]
fn the_kubelet_range_is_checked_like_upstream() {
    let d = tempfile::tempdir().unwrap();
    let new = |first_id, length, max_pods| {
        UsernsManager::new(
            d.path(),
            KubeletMappings { first_id, length },
            max_pods,
            USERNS_LENGTH,
        )
        .err()
    };
    assert_eq!(
        new(65537, 65536 * 10, 1),
        Some(UsernsError::FirstIdNotAligned(65537, 65536))
    );
    assert_eq!(
        new(0, 65536 * 10, 1),
        Some(UsernsError::FirstIdTooLow(0, 65536))
    );
    assert_eq!(
        new(65536, 65536 * 10 + 1, 1),
        Some(UsernsError::LengthNotAligned(655361, 65536))
    );
    assert_eq!(
        new(65536, 65536 * 10, 110),
        Some(UsernsError::TooFewIds(110))
    );
    assert_eq!(
        UsernsError::TooFewIds(110).to_string(),
        "kubelet user assigned IDs are not enough to support 110 pods"
    );
    assert_eq!(
        new(1 << 31, (1 << 31) + 65536, 1),
        Some(UsernsError::PastIdSpace {
            first_id: 1 << 31,
            length: (1 << 31) + 65536
        }),
        "the range would wrap past id 2^32-1"
    );
    assert_eq!(new(1 << 31, 1 << 31, 1), None, "up to the last id is fine");
    assert_eq!(new(65536, 65536 * 110, 110), None);
    // upstream's default range: everything from 65536 up, 65535 blocks.
    let m = UsernsManager::new(d.path(), KubeletMappings::default(), 110, USERNS_LENGTH).unwrap();
    assert_eq!(m.lock().used.len(), 65535);
}

#[test]
fn the_last_block_of_the_id_space_is_usable() {
    let d = tempfile::tempdir().unwrap();
    let m = UsernsManager::new(
        d.path(),
        KubeletMappings {
            first_id: u32::MAX - USERNS_LENGTH + 1,
            length: USERNS_LENGTH,
        },
        1,
        USERNS_LENGTH,
    )
    .unwrap();
    let u = m
        .get_or_create(&pod("a", Some(false)), "", Some(&handlers(true)))
        .unwrap();
    assert_eq!(host_of(&u), 4294901760);
    m.release("a");
    assert!(m.allocated().is_empty());
}

#[test]
fn subid_files_give_the_kubelet_range() {
    let d = tempfile::tempdir().unwrap();
    let files = SubIdFiles {
        subuid: d.path().join("subuid"),
        subgid: d.path().join("subgid"),
    };
    assert_eq!(
        KubeletMappings::from_files(&files, USERNS_LENGTH),
        Ok(KubeletMappings::default()),
        "no files: upstream's default"
    );
    let text = "# comment\nalice:100000:65536\n\nkubelet:196608:6553600\n";
    std::fs::write(&files.subuid, text).unwrap();
    std::fs::write(&files.subgid, text).unwrap();
    assert_eq!(
        KubeletMappings::from_files(&files, USERNS_LENGTH),
        Ok(KubeletMappings {
            first_id: 196608,
            length: 6553600
        })
    );
    std::fs::write(&files.subuid, "alice:100000:65536\n").unwrap();
    std::fs::write(&files.subgid, "bob:100000:65536\n").unwrap();
    assert_eq!(
        KubeletMappings::from_files(&files, USERNS_LENGTH),
        Ok(KubeletMappings::default()),
        "other users' entries do not count"
    );
}

#[test]
fn bad_subid_files_are_errors() {
    let d = tempfile::tempdir().unwrap();
    let files = SubIdFiles {
        subuid: d.path().join("subuid"),
        subgid: d.path().join("subgid"),
    };
    std::fs::write(&files.subuid, "kubelet:65536:655360\n").unwrap();
    std::fs::write(&files.subgid, "kubelet:131072:655360\n").unwrap();
    assert_eq!(
        KubeletMappings::from_files(&files, USERNS_LENGTH),
        Err(UsernsError::SubIdsMismatch)
    );
    assert_eq!(
        UsernsError::SubIdsMismatch.to_string(),
        "mismatched subuids and subgids for user \"kubelet\""
    );
    std::fs::write(&files.subgid, "").unwrap();
    assert_eq!(
        KubeletMappings::from_files(&files, USERNS_LENGTH),
        Err(UsernsError::SubIdsMismatch),
        "an entry in only one file"
    );
    let two = "kubelet:65536:65536\nkubelet:262144:65536\n";
    std::fs::write(&files.subuid, two).unwrap();
    std::fs::write(&files.subgid, two).unwrap();
    let err = KubeletMappings::from_files(&files, USERNS_LENGTH)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("must have exactly one range, it has 2"),
        "{err}"
    );
    std::fs::write(&files.subuid, "kubelet:lots:65536\n").unwrap();
    let err = KubeletMappings::from_files(&files, USERNS_LENGTH)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!(
            "{}: error parsing line \"kubelet:lots:65536\"",
            files.subuid.display()
        )),
        "{err}"
    );
    std::fs::write(&files.subuid, "kubelet:65536\n").unwrap();
    let err = KubeletMappings::from_files(&files, USERNS_LENGTH)
        .unwrap_err()
        .to_string();
    assert!(err.ends_with("invalid line \"kubelet:65536\""), "{err}");
}

#[test]
fn a_range_from_subid_files_must_still_be_aligned() {
    let d = tempfile::tempdir().unwrap();
    let files = SubIdFiles {
        subuid: d.path().join("subuid"),
        subgid: d.path().join("subgid"),
    };
    // The common useradd default: 100000 is not a multiple of 65536.
    std::fs::write(&files.subuid, "kubelet:100000:65536\n").unwrap();
    std::fs::write(&files.subgid, "kubelet:100000:65536\n").unwrap();
    let mappings = KubeletMappings::from_files(&files, USERNS_LENGTH).unwrap();
    let err = UsernsManager::new(&d.path().join("pods"), mappings, 1, USERNS_LENGTH)
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "kubelet user assigned ID 100000 is not a multiple of 65536"
    );
}

#[test]
fn ids_per_pod_sets_the_block_size() {
    let d = tempfile::tempdir().unwrap();
    let per = 2 * USERNS_LENGTH;
    let files = SubIdFiles {
        subuid: d.path().join("none"),
        subgid: d.path().join("none"),
    };
    let mappings = KubeletMappings::from_files(&files, per).unwrap();
    assert_eq!(
        mappings,
        KubeletMappings {
            first_id: 131072,
            length: 32767 * 131072
        },
        "the default range starts one block up and ends on a block boundary"
    );
    let m = UsernsManager::new(&d.path().join("pods"), mappings, 110, per).unwrap();
    let h = handlers(true);
    let a = userns_of(&m, "a", &h);
    let b = userns_of(&m, "b", &h);
    assert_eq!(
        (a.uids[0].host_id, a.uids[0].length),
        (131072, 131072),
        "a block of idsPerPod ids"
    );
    assert_eq!(b.uids[0].host_id, 262144);
    drop(m);
    let m = UsernsManager::new(&d.path().join("pods"), mappings, 110, per).unwrap();
    assert_eq!(m.host_id("b"), Some(262144), "reloaded with the same size");
    // A kubelet restarted with another idsPerPod cannot take these files back.
    let other = UsernsManager::new(
        &d.path().join("pods"),
        KubeletMappings::default(),
        110,
        USERNS_LENGTH,
    )
    .unwrap();
    assert_eq!(
        other
            .get_or_create(&pod("a", Some(false)), "", Some(&h))
            .unwrap_err(),
        "user namespace: wrong user namespace length 131072"
    );
    assert_eq!(
        UsernsManager::new(d.path(), mappings, 1, 100_000).err(),
        Some(UsernsError::IdsPerPodNotAligned(100_000))
    );
    assert_eq!(
        UsernsManager::new(
            d.path(),
            KubeletMappings {
                first_id: 65536,
                length: 131072 * 10
            },
            1,
            per
        )
        .err()
        .map(|e| e.to_string()),
        Some("kubelet user assigned ID 65536 is not a multiple of 131072".into())
    );
}
