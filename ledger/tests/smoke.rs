use ledger::*;

#[test]
fn seed_example() {
    let dir = tempfile::tempdir().unwrap();
    let (l, r) = Ledger::open(Config::new(dir.path().join("db"))).unwrap();
    assert!(r.fresh);
    let c = ClientId::default_client();
    let rub = Currency::parse("RUB").unwrap();
    let alice = Account::parse("alice").unwrap();
    let dep = Command::Deposit {
        account: alice.clone(),
        amount: Amount::new(1000).unwrap(),
        currency: rub,
    };
    let s = l.submit(&c, &Key::parse("dep-1").unwrap(), dep).unwrap();
    assert!(matches!(s, Submission::Executed(_)));
    let w = Command::Withdraw {
        account: alice.clone(),
        amount: Amount::new(300).unwrap(),
        currency: rub,
    };
    for i in 0..3 {
        let s = l
            .submit(&c, &Key::parse("req-7f3a").unwrap(), w.clone())
            .unwrap();
        let o = s.outcome().unwrap();
        match o {
            Outcome::Applied(r) => assert_eq!(r.balance, 700),
            _ => panic!(),
        }
        assert_eq!(matches!(s, Submission::Replayed(_)), i > 0);
    }
    let w2 = Command::Withdraw {
        account: alice.clone(),
        amount: Amount::new(200).unwrap(),
        currency: rub,
    };
    let s = l.submit(&c, &Key::parse("req-91bc").unwrap(), w2).unwrap();
    match s.outcome().unwrap() {
        Outcome::Applied(r) => assert_eq!(r.balance, 500),
        _ => panic!(),
    }
    let v = l.verify().unwrap();
    assert!(v.ok(), "{v}");
    l.shutdown();
    drop(l);
    let (l, r) = Ledger::open(Config::new(dir.path().join("db"))).unwrap();
    println!("{r}");
    assert_eq!(r.facts, 3);
    assert!(l.verify().unwrap().ok());
}
